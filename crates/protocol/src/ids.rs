//! Random ids and hex text, made one way everywhere: random bytes come from the system's source or
//! not at all (an error, never zero bytes or the clock standing in), and hex is lowercase.

/// `bytes` as lowercase hex, two characters a byte.
pub fn hex(bytes: impl AsRef<[u8]>) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = bytes.as_ref();
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    text
}

/// `N` random bytes from the system's source.
pub fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|_| std::io::Error::other("the system gave no random bytes"))?;
    Ok(bytes)
}

/// `N` random bytes as hex (`2 * N` characters).
pub fn random_hex<const N: usize>() -> std::io::Result<String> {
    random::<N>().map(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex([0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex([]), "");
    }

    #[test]
    fn random_ids_differ_and_have_their_length() {
        let a = random_hex::<16>().unwrap();
        let b = random_hex::<16>().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
