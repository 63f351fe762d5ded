//! NumPy's `default_rng(seed).integers(0, high, dtype=int64)`, bit for bit.
//!
//! The Engram hash multipliers were drawn this way when the V4.1 tables were trained, so a
//! different generator would silently rehash every n-gram. Three NumPy pieces are reproduced:
//! `SeedSequence` (entropy -> 256 bits of state, `numpy/random/bit_generator.pyx`), `PCG64`
//! (128-bit LCG with the XSL-RR output, `numpy/random/src/pcg64`) and the bounded-integer fill
//! `random_bounded_uint64_fill` with `use_masked = false` (Lemire's method,
//! `numpy/random/src/distributions/distributions.c`), including its 32-bit branch.

const POOL_SIZE: usize = 4;
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;

/// `SeedSequence(entropy)` with no spawn key: a pool of four u32 words mixed from the entropy.
struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

/// NumPy's `hashmix`: `hash_const` is state shared by every call of one mixing pass.
fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut value = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    value = value.wrapping_mul(*hash_const);
    value ^ (value >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let result = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    result ^ (result >> XSHIFT)
}

/// A Python int as NumPy coerces it for `SeedSequence`: little-endian u32 words, `[0]` for 0.
fn entropy_words(entropy: u64) -> Vec<u32> {
    if entropy == 0 {
        return vec![0];
    }
    let mut words = Vec::new();
    let mut rest = entropy;
    while rest > 0 {
        words.push(rest as u32);
        rest >>= 32;
    }
    words
}

impl SeedSequence {
    /// `SeedSequence.mix_entropy`: hash each word into the pool, cross-mix the pool words, then
    /// fold in any entropy words beyond the pool.
    fn new(entropy: u64) -> Self {
        let words = entropy_words(entropy);
        let mut hash_const = INIT_A;
        let mut pool = [0u32; POOL_SIZE];
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(words.get(i).copied().unwrap_or(0), &mut hash_const);
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    pool[dst] = mix(pool[dst], hashmix(pool[src], &mut hash_const));
                }
            }
        }
        for &word in words.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                *slot = mix(*slot, hashmix(word, &mut hash_const));
            }
        }
        Self { pool }
    }

    /// `generate_state(n, np.uint64)`: `2n` u32 words cycled from the pool, paired little-endian.
    fn generate_state_u64<const N: usize>(&self) -> [u64; N] {
        let mut hash_const = INIT_B;
        let mut next_word = |i: usize| {
            let mut value = self.pool[i % POOL_SIZE] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            value = value.wrapping_mul(hash_const);
            value ^ (value >> XSHIFT)
        };
        let mut out = [0u64; N];
        for (k, slot) in out.iter_mut().enumerate() {
            let low = next_word(2 * k);
            let high = next_word(2 * k + 1);
            *slot = u64::from(low) | (u64::from(high) << 32);
        }
        out
    }
}

const PCG_MULTIPLIER: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// NumPy's `PCG64` bit generator, including its one-word buffer for 32-bit draws.
struct Pcg64 {
    state: u128,
    inc: u128,
    buffered_u32: Option<u32>,
}

impl Pcg64 {
    /// `PCG64(seed)`: four SeedSequence words give the initial state and the stream.
    fn from_seed(seed: u64) -> Self {
        let words = SeedSequence::new(seed).generate_state_u64::<4>();
        let initstate = (u128::from(words[0]) << 64) | u128::from(words[1]);
        let initseq = (u128::from(words[2]) << 64) | u128::from(words[3]);
        let mut rng = Self {
            state: 0,
            inc: (initseq << 1) | 1,
            buffered_u32: None,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(initstate);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self
            .state
            .wrapping_mul(PCG_MULTIPLIER)
            .wrapping_add(self.inc);
    }

    fn next_u64(&mut self) -> u64 {
        self.step();
        let folded = ((self.state >> 64) as u64) ^ (self.state as u64);
        folded.rotate_right((self.state >> 122) as u32)
    }

    /// Low half of a fresh 64-bit draw, the high half kept for the next call.
    fn next_u32(&mut self) -> u32 {
        if let Some(high) = self.buffered_u32.take() {
            return high;
        }
        let draw = self.next_u64();
        self.buffered_u32 = Some((draw >> 32) as u32);
        draw as u32
    }

    /// Lemire's nearly-divisionless draw in `[0, rng]` for `rng < u64::MAX`.
    fn bounded_lemire_u64(&mut self, rng: u64) -> u64 {
        let rng_excl = rng + 1;
        let mut m = u128::from(self.next_u64()) * u128::from(rng_excl);
        if (m as u64) < rng_excl {
            let threshold = (u64::MAX - rng) % rng_excl;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(rng_excl);
            }
        }
        (m >> 64) as u64
    }

    /// The 32-bit Lemire draw in `[0, rng]` for `rng < u32::MAX`.
    fn bounded_lemire_u32(&mut self, rng: u32) -> u32 {
        let rng_excl = rng + 1;
        let mut m = u64::from(self.next_u32()) * u64::from(rng_excl);
        if (m as u32) < rng_excl {
            let threshold = (u32::MAX - rng) % rng_excl;
            while (m as u32) < threshold {
                m = u64::from(self.next_u32()) * u64::from(rng_excl);
            }
        }
        (m >> 32) as u32
    }
}

/// `np.random.default_rng(seed).integers(0, high, size=out.len(), dtype=np.int64)` written to
/// `out`; `high` must be positive (NumPy raises otherwise, callers check).
pub(crate) fn integers_below(seed: u64, high: u64, out: &mut [u64]) {
    let mut rng = Pcg64::from_seed(seed);
    let range = high.saturating_sub(1);
    for slot in out.iter_mut() {
        *slot = match range {
            0 => 0,
            r if r == u64::from(u32::MAX) => u64::from(rng.next_u32()),
            r if r < u64::from(u32::MAX) => u64::from(rng.bounded_lemire_u32(r as u32)),
            u64::MAX => rng.next_u64(),
            r => rng.bounded_lemire_u64(r),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `np.random.PCG64(0).random_raw(3)` and `PCG64(10007).random_raw(2)`.
    #[test]
    fn pcg64_raw_draws_match_numpy() {
        let mut zero = Pcg64::from_seed(0);
        let draws: Vec<u64> = (0..3).map(|_| zero.next_u64()).collect();
        assert_eq!(draws, RAW_SEED_0);
        let mut layer1 = Pcg64::from_seed(10007);
        let draws: Vec<u64> = (0..2).map(|_| layer1.next_u64()).collect();
        assert_eq!(draws, RAW_SEED_10007);
    }

    const RAW_SEED_0: [u64; 3] = [
        11749869230777074271,
        4976686463289251617,
        755828109848996024,
    ];
    const RAW_SEED_10007: [u64; 2] = [15187255322829266483, 959186003677246517];
}
