//! What every measurement takes of its samples: the median, and rounding for the report.

/// The median (the mean of the middle two of an even count); 0 for no samples.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let at = |i: usize| sorted.get(i).copied().unwrap_or(0.0);
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    }
}

/// The `p`th percentile of samples sorted in ascending order (the nearest rank); 0 for none.
pub fn percentile(sorted: &[f64], p: usize) -> f64 {
    let n = sorted.len();
    sorted
        .get((n * p).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_odd_even_and_no_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn rounding_keeps_one_or_three_places() {
        assert_eq!(round1(1.26), 1.3);
        assert_eq!(round3(1.0004), 1.0);
        assert_eq!(round3(0.9996), 1.0);
    }
}
