//! Which partition Event Hubs puts a partition key on, worked out on the client.
//!
//! Sending by partition key through the hub's gateway costs one sequential round trip
//! per key: a batch carries one key. Knowing where the service would put each key lets
//! the sink fill one batch per *partition* with many keys and send the partitions side
//! by side. The placement must be the service's own, or a key would change partition
//! depending on which client sent it: the Event Hubs gateway and every Azure SDK hash
//! the key's UTF-8 bytes with Bob Jenkins' lookup3 (`hashlittle2`, both seeds 0), fold
//! the two 32-bit results into a signed 16-bit value, and take its absolute remainder
//! by the partition count as the index into the hub's partition ids. (Facts from the
//! .NET SDK's `PartitionResolver` and the test vectors it shares with the Rust crate's
//! buffered producer, whose resolver is not public.)

/// The hub's partitions, and where a key goes among them.
#[derive(Debug, PartialEq, Eq)]
pub struct PartitionMap {
    ids: Vec<String>,
}

impl PartitionMap {
    /// `None` for an empty list: a hub always has at least one partition.
    pub fn new(ids: Vec<String>) -> Option<Self> {
        (!ids.is_empty()).then_some(PartitionMap { ids })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The partition the service assigns `key` to. An empty key is hashed like any
    /// other, so the segments of an event whose key is empty stay together.
    pub fn partition_for(&self, key: &str) -> &str {
        &self.ids[index_for(key_hash(key), self.ids.len())]
    }
}

/// The index a key's 16-bit hash selects among `count` partitions.
fn index_for(hash: i16, count: usize) -> usize {
    // The remainder keeps the sign of the hash, hence the absolute value.
    (i32::from(hash) % count as i32).unsigned_abs() as usize
}

/// The 16-bit hash of a partition key: the two lookup3 results folded together.
fn key_hash(key: &str) -> i16 {
    let (c, b) = hashlittle2(key.as_bytes());
    (c ^ b) as u16 as i16
}

/// lookup3's `hashlittle2` with both seeds 0: the bytes in 12-byte blocks as three
/// little-endian words, mixed; the last block (1 to 12 bytes) zero-padded and put
/// through the final mix. Returns `(c, b)`. An empty key skips the final mix.
fn hashlittle2(data: &[u8]) -> (u32, u32) {
    let start = 0xdead_beef_u32.wrapping_add(data.len() as u32);
    let (mut a, mut b, mut c) = (start, start, start);
    let mut rest = data;
    // Every block but the last is mixed; the last, even a whole one, is finalized.
    while rest.len() > 12 {
        let (block, tail) = rest.split_at(12);
        let [x, y, z] = words(block);
        a = a.wrapping_add(x);
        b = b.wrapping_add(y);
        c = c.wrapping_add(z);
        mix(&mut a, &mut b, &mut c);
        rest = tail;
    }
    if rest.is_empty() {
        return (c, b);
    }
    let [x, y, z] = words(rest);
    a = a.wrapping_add(x);
    b = b.wrapping_add(y);
    c = c.wrapping_add(z);
    finish(&mut a, &mut b, &mut c);
    (c, b)
}

/// Up to 12 bytes as three little-endian words, missing bytes zero.
fn words(block: &[u8]) -> [u32; 3] {
    let mut padded = [0u8; 12];
    padded[..block.len()].copy_from_slice(block);
    let word =
        |i: usize| u32::from_le_bytes([padded[i], padded[i + 1], padded[i + 2], padded[i + 3]]);
    [word(0), word(4), word(8)]
}

/// lookup3's `mix`: each step subtracts, xors a rotation of another word, and adds.
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    for (x, y, z, r) in [
        (0, 2, 1, 4),
        (1, 0, 2, 6),
        (2, 1, 0, 8),
        (0, 2, 1, 16),
        (1, 0, 2, 19),
        (2, 1, 0, 4),
    ] {
        let mut w = [*a, *b, *c];
        w[x] = w[x].wrapping_sub(w[y]);
        w[x] ^= w[y].rotate_left(r);
        w[y] = w[y].wrapping_add(w[z]);
        [*a, *b, *c] = w;
    }
}

/// lookup3's `final`: `target ^= source; target -= source <<< r`, seven times.
fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    for (target, source, r) in [
        (2, 1, 14),
        (0, 2, 11),
        (1, 0, 25),
        (2, 1, 16),
        (0, 2, 4),
        (1, 0, 14),
        (2, 1, 24),
    ] {
        let mut w = [*a, *b, *c];
        w[target] ^= w[source];
        w[target] = w[target].wrapping_sub(w[source].rotate_left(r));
        [*a, *b, *c] = w;
    }
}

/// The longest partition key Event Hubs takes (its SDKs' limit, in characters).
const MAX_PARTITION_KEY_CHARS: usize = 128;

/// A partition key Event Hubs takes: itself up to [`MAX_PARTITION_KEY_CHARS`], a longer
/// one (a `primary_key` key of a wide key, say) as `~` and the hex of its UUID v5 —
/// deterministic, so one key keeps one partition, and 33 characters long.
pub(super) fn fixed_length_key(key: String) -> String {
    if key.chars().count() <= MAX_PARTITION_KEY_CHARS {
        return key;
    }
    format!(
        "~{}",
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, key.as_bytes()).simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys and hashes from the Azure SDKs' shared test vectors (.NET
    /// `PartitionResolverTests`), which the service's placement agrees with. They
    /// cover tails of 1–5, 7, 8, 10 and 12 bytes and keys of several blocks.
    const VECTORS: &[(&str, i16)] = &[
        ("7", -15263),
        ("131", 30562),
        ("7149583486996073602", 12977),
        ("FWfAT", -22341),
        ("sOdeEAsyQoEuEFPGerWO", -6503),
        (
            "FAyAIctPeCgmiwLKbJcyswoHglHVjQdvtBowLACDNORsYvOcLddNJYDmhAVkbyLOrHTKLneMNcbgWVlasVywOByANjs",
            5226,
        ),
        (
            "1XYM6!(7(lF5wq4k4m*e$Nc!1ezLJv*1YK1Y-C^*&B$O)lq^iUkG(TNzXG;Zi#z2Og*Qq0#^*k):vXh$3,C7We7%W0meJ;b3,rQCg^J;^twXgs5E$$hWKxqp",
            23950,
        ),
        (
            "E(x;RRIaQcJs*P;D&jTPau-4K04oqr:lF6Z):ERpo&;9040qyV@G1_c9mgOs-8_8/10Fwa-7b7-yP!T-!IH&968)FWuI;(^g$2fN;)HJ^^yTn:",
            -29304,
        ),
        ("!c*_!I@1^c", 15372),
        ("p4*!jioeO/z-!-;w:dh", -3104),
        ("$0cb", 26269),
        ("-4189260826195535198", 453),
    ];

    #[test]
    fn hashes_match_the_services_placement() {
        for (key, want) in VECTORS {
            assert_eq!(key_hash(key), *want, "key {key:?}");
        }
    }

    #[test]
    fn lookup3_of_nothing() {
        // Bob Jenkins' reference self-test: hashlittle2("", 0, 0) gives deadbeef twice.
        assert_eq!(hashlittle2(b""), (0xdead_beef, 0xdead_beef));
    }

    #[test]
    fn a_negative_hash_selects_a_partition_in_range() {
        // -15263 % 4 = -3 in two's-complement remainder: partition 3, not an overflow.
        assert_eq!(index_for(-15263, 4), 3);
        assert_eq!(index_for(30562, 4), 2);
        assert_eq!(index_for(i16::MIN, 32), 0);
        assert_eq!(index_for(-1, 32), 1);
        let map = PartitionMap::new((0..4).map(|i| i.to_string()).collect()).expect("ids");
        assert_eq!(map.partition_for("7"), "3");
        assert_eq!(map.partition_for("131"), "2");
        assert_eq!(map.len(), 4);
        assert!(!map.is_empty());
    }

    #[test]
    fn an_empty_key_always_lands_on_one_partition() {
        let map = PartitionMap::new(vec!["a".into(), "b".into(), "c".into()]).expect("ids");
        // hashlittle2("") = (deadbeef, deadbeef): folded, 0; 0 % 3 = 0.
        let places: Vec<&str> = (0..4).map(|_| map.partition_for("")).collect();
        assert_eq!(places, ["a"; 4]);
        assert!(PartitionMap::new(Vec::new()).is_none());
    }
}
