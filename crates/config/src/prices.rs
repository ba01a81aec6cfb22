//! What a model call costs, as pi-ai prices it: US dollars per million tokens, with request-wide
//! tiers. Shared by pi's catalog and the overlay's `models.json`.

/// US dollars per million tokens, as pi-ai prices a model (0 where it gives no price).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Prices {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_write: f64,
}

/// A request-wide price tier: these prices when the request's input (cache included) is above
/// `above` tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    pub above: u64,
    pub prices: Prices,
}
