//! SQL Server log sequence numbers.
//!
//! A CDC LSN is `binary(10)`: a 4-byte virtual-log-file sequence number, a 4-byte log
//! block offset and a 2-byte slot, all big-endian. Because every part is big-endian and
//! the parts are laid out most significant first, comparing the ten bytes
//! lexicographically is the same as comparing LSNs numerically; `Lsn` wraps the byte
//! array so that the derived `Ord` is that comparison.
//!
//! Two text forms appear in CES events: `000000B1:000008A8:0007` (in
//! `data.eventsource.transaction`) and `000000B1000008A80007` (in `logicalid`). Both are
//! upper-case hex; parsing accepts either case and an optional `0x` prefix.

use std::fmt;

/// Number of bytes in a CDC LSN (`binary(10)`).
pub const LSN_LEN: usize = 10;

/// A 10-byte SQL Server log sequence number.
///
/// The derived `Ord` compares the bytes lexicographically, which is numeric order
/// because the representation is big-endian with the most significant part first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn([u8; LSN_LEN]);

/// Why a byte string or text is not an LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LsnError {
    #[error("an LSN is 10 bytes, got {len}")]
    WrongLength { len: usize },
    #[error("`{text}` is not an LSN: {reason}")]
    InvalidText { text: String, reason: &'static str },
}

impl Lsn {
    /// The lowest LSN (all zero bytes). CDC functions return it when no LSN is known.
    pub const ZERO: Lsn = Lsn([0; LSN_LEN]);
    /// The highest LSN.
    pub const MAX: Lsn = Lsn([0xFF; LSN_LEN]);

    pub const fn from_array(bytes: [u8; LSN_LEN]) -> Self {
        Lsn(bytes)
    }

    /// Builds an LSN from its three parts.
    pub fn from_parts(vlf: u32, block: u32, slot: u16) -> Self {
        let mut bytes = [0u8; LSN_LEN];
        bytes[0..4].copy_from_slice(&vlf.to_be_bytes());
        bytes[4..8].copy_from_slice(&block.to_be_bytes());
        bytes[8..10].copy_from_slice(&slot.to_be_bytes());
        Lsn(bytes)
    }

    /// Reads an LSN from a `binary(10)` column value.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, LsnError> {
        let array: [u8; LSN_LEN] = bytes
            .try_into()
            .map_err(|_| LsnError::WrongLength { len: bytes.len() })?;
        Ok(Lsn(array))
    }

    pub fn as_bytes(&self) -> &[u8; LSN_LEN] {
        &self.0
    }

    pub fn to_vec(self) -> Vec<u8> {
        self.0.to_vec()
    }

    pub fn is_zero(&self) -> bool {
        *self == Lsn::ZERO
    }

    /// The LSN as a 128-bit number (the low 80 bits are used).
    pub fn to_u128(self) -> u128 {
        self.0
            .iter()
            .fold(0u128, |acc, b| (acc << 8) | u128::from(*b))
    }

    /// The LSN whose number is `value`; `None` if it needs more than 80 bits.
    pub fn from_u128(value: u128) -> Option<Self> {
        if value >> 80 != 0 {
            return None;
        }
        let wide = value.to_be_bytes();
        let mut bytes = [0u8; LSN_LEN];
        bytes.copy_from_slice(&wide[16 - LSN_LEN..]);
        Some(Lsn(bytes))
    }

    /// The next LSN in numeric order (as `sys.fn_cdc_increment_lsn` computes it), or
    /// `None` at [`Lsn::MAX`].
    pub fn increment(self) -> Option<Self> {
        Lsn::from_u128(self.to_u128() + 1)
    }

    /// `000000B1:000008A8:0007`, the form used in `data.eventsource.transaction`.
    pub fn to_colon_string(self) -> String {
        let mut out = String::with_capacity(22);
        self.write_colon(&mut out);
        out
    }

    /// Appends the colon form to `out`.
    pub fn write_colon(&self, out: &mut String) {
        push_hex(out, &self.0[0..4]);
        out.push(':');
        push_hex(out, &self.0[4..8]);
        out.push(':');
        push_hex(out, &self.0[8..10]);
    }

    /// `000000B1000008A80007`, the form used in `logicalid`.
    pub fn to_compact_string(self) -> String {
        let mut out = String::with_capacity(20);
        push_hex(&mut out, &self.0);
        out
    }

    /// Parses either text form, case-insensitively, with an optional `0x` prefix.
    pub fn parse(text: &str) -> Result<Self, LsnError> {
        let invalid = |reason| LsnError::InvalidText {
            text: text.to_owned(),
            reason,
        };
        let body = text
            .strip_prefix("0x")
            .or_else(|| text.strip_prefix("0X"))
            .unwrap_or(text);
        let digits: String = if body.contains(':') {
            let parts: Vec<&str> = body.split(':').collect();
            if parts.len() != 3 || parts[0].len() != 8 || parts[1].len() != 8 || parts[2].len() != 4
            {
                return Err(invalid(
                    "expected 8:8:4 hex digits, as in 000000B1:000008A8:0007",
                ));
            }
            parts.concat()
        } else {
            body.to_owned()
        };
        if digits.len() != 2 * LSN_LEN {
            return Err(invalid("expected 20 hex digits or the 8:8:4 form"));
        }
        // Checked here because `from_str_radix` would also accept a leading `+`.
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("not a hex digit"));
        }
        let mut bytes = [0u8; LSN_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = &digits[2 * i..2 * i + 2];
            *byte = u8::from_str_radix(pair, 16).map_err(|_| invalid("not a hex digit"))?;
        }
        Ok(Lsn(bytes))
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `bytes` as upper-case hex digits.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
        out.push(char::from(HEX_UPPER[usize::from(b & 0x0F)]));
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_colon_string())
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lsn({})", self.to_colon_string())
    }
}

impl std::str::FromStr for Lsn {
    type Err = LsnError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Lsn::parse(s)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_colon_string())
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Lsn::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn both_text_forms_of_the_ces_example() {
        let lsn = Lsn::from_parts(0xB1, 0x8A8, 7);
        assert_eq!(lsn.to_colon_string(), "000000B1:000008A8:0007");
        assert_eq!(lsn.to_compact_string(), "000000B1000008A80007");
        assert_eq!(Lsn::parse("000000B1:000008A8:0007"), Ok(lsn));
        assert_eq!(Lsn::parse("000000b1000008a80007"), Ok(lsn));
        assert_eq!(Lsn::parse("0x000000B1000008A80007"), Ok(lsn));
    }

    #[test]
    fn malformed_text_is_rejected_with_a_reason() {
        for bad in [
            "",
            "000000B1:000008A8",
            "000000B1:000008A8:007",
            "000000B1000008A8000",
            "000000B1000008A800070",
            "000000G1000008A80007",
            "+00000B1000008A80007",
            "000000B1:000008A8:00:7",
        ] {
            assert!(
                matches!(Lsn::parse(bad), Err(LsnError::InvalidText { .. })),
                "{bad:?} parsed"
            );
        }
        assert_eq!(
            Lsn::from_bytes(&[1, 2, 3]),
            Err(LsnError::WrongLength { len: 3 })
        );
    }

    #[test]
    fn increment_carries_across_parts_and_stops_at_max() {
        let lsn = Lsn::from_parts(1, u32::MAX, u16::MAX);
        assert_eq!(lsn.increment(), Some(Lsn::from_parts(2, 0, 0)));
        assert_eq!(Lsn::MAX.increment(), None);
        assert_eq!(Lsn::ZERO.increment(), Some(Lsn::from_parts(0, 0, 1)));
    }

    proptest! {
        #[test]
        fn text_and_byte_forms_round_trip(bytes in any::<[u8; 10]>()) {
            let lsn = Lsn::from_array(bytes);
            prop_assert_eq!(Lsn::parse(&lsn.to_colon_string()), Ok(lsn));
            prop_assert_eq!(Lsn::parse(&lsn.to_compact_string()), Ok(lsn));
            prop_assert_eq!(Lsn::from_bytes(&lsn.to_vec()), Ok(lsn));
            prop_assert_eq!(Lsn::from_u128(lsn.to_u128()), Some(lsn));
        }

        #[test]
        fn order_is_numeric_order(a in any::<[u8; 10]>(), b in any::<[u8; 10]>()) {
            let (x, y) = (Lsn::from_array(a), Lsn::from_array(b));
            prop_assert_eq!(x.cmp(&y), x.to_u128().cmp(&y.to_u128()));
            // The text forms sort the same way, which keeps logs and file names readable.
            prop_assert_eq!(x.cmp(&y), x.to_compact_string().cmp(&y.to_compact_string()));
        }

        #[test]
        fn increment_is_the_successor(a in any::<[u8; 10]>()) {
            let lsn = Lsn::from_array(a);
            if let Some(next) = lsn.increment() {
                prop_assert!(next > lsn);
                prop_assert_eq!(next.to_u128(), lsn.to_u128() + 1);
            } else {
                prop_assert_eq!(lsn, Lsn::MAX);
            }
        }
    }
}
