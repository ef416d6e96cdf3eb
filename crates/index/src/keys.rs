//! Packet keys: the header fields of one packet that stay the same along a flow direction, packed into a fixed
//! byte string, and the per-chunk key table that stores each distinct key once, column by column, with a sorted
//! dictionary per field. TCP flags and the wire-length class change from packet to packet; they are sequences of
//! their own (`flags_code`, `len_class`).

use pcaptool_packet::{Field, FieldValue, PacketFields, Pred};

use crate::format::{Cursor, Out};

/// The header fields a key holds, in key order: every field but TCP flags, wire length and time.
pub const KEY_FIELDS: [Field; 13] = {
    let mut a = [Field::LinkProto; 13];
    let mut i = 0;
    while i < a.len() {
        a[i] = Field::ALL[i];
        i += 1;
    }
    a
};

/// Upper bounds (inclusive) of the wire-length classes the index keeps per packet.
pub const LEN_BOUNDS: [u32; 8] = [64, 128, 256, 512, 1024, 1518, 9216, u32::MAX];

/// Bytes of a field's value in a key and in a dictionary.
pub(crate) const fn width(f: Field) -> usize {
    match f {
        Field::LinkProto | Field::SrcPort | Field::DstPort | Field::VlanId => 2,
        Field::EthSrc | Field::EthDst => 6,
        Field::Ip4Src | Field::Ip4Dst | Field::ArpSpa | Field::ArpTpa => 4,
        Field::Ip6Src | Field::Ip6Dst => 16,
        Field::IpProto | Field::TcpFlags => 1,
        Field::WireLen => 4,
        Field::Time => 8,
    }
}

const fn key_bytes() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < KEY_FIELDS.len() {
        n += 1 + width(KEY_FIELDS[i]);
        i += 1;
    }
    n
}

/// Bytes of a packed key.
pub(crate) const KEY_BYTES: usize = key_bytes();

/// One packet's key: per field a tag (0 missing, 1 unknown, 2 present) and the value big-endian.
pub(crate) type Key = [u8; KEY_BYTES];

/// The class of a wire length.
pub(crate) fn len_class(wirelen: u32) -> u8 {
    LEN_BOUNDS.iter().position(|&b| wirelen <= b).unwrap_or(LEN_BOUNDS.len() - 1) as u8
}

/// The code of a field value in a sequence or a key table column: 0 missing, 1 unknown, `2 + v` present.
pub(crate) fn code_of(v: FieldValue) -> u32 {
    match v {
        FieldValue::Missing => 0,
        FieldValue::Unknown => 1,
        FieldValue::Value(v) => 2 + v as u32,
    }
}

/// The TCP flags of a packet as a sequence symbol ([`code_of`]).
pub(crate) fn flags_code(fields: &PacketFields<'_>) -> u32 {
    code_of(fields.get(Field::TcpFlags))
}

/// Whether a sequence symbol ([`code_of`]) may satisfy `pred`.
pub(crate) fn code_may(code: u32, pred: &Pred) -> bool {
    match code {
        0 => false,
        1 => true,
        c => pred.holds(u128::from(c - 2)),
    }
}

/// The smallest and largest wire length of class `class`.
fn class_range(class: u32) -> (u128, u128) {
    let c = (class as usize).min(LEN_BOUNDS.len() - 1);
    let min = if c == 0 { 0 } else { u128::from(LEN_BOUNDS[c - 1]) + 1 };
    (min, u128::from(LEN_BOUNDS[c]))
}

/// Whether a packet of wire-length class `class` may satisfy the wire-length predicate `pred`.
pub(crate) fn class_may(class: u32, pred: &Pred) -> bool {
    let (min, max) = class_range(class);
    pred.mask != u128::MAX || (min <= pred.hi && pred.lo <= max)
}

/// Whether every length of class `class` satisfies `pred`, or none does (the class decides the predicate).
pub(crate) fn class_decided(class: u32, pred: &Pred) -> bool {
    let (min, max) = class_range(class);
    pred.mask == u128::MAX && ((pred.lo <= min && max <= pred.hi) || max < pred.lo || pred.hi < min)
}

/// The key of a packet.
pub(crate) fn key_of(fields: &PacketFields<'_>) -> Key {
    let mut k = [0u8; KEY_BYTES];
    let mut at = 0;
    let all = fields.get_all();
    for (i, f) in KEY_FIELDS.into_iter().enumerate() {
        let w = width(f);
        match all[i] {
            FieldValue::Missing => k[at] = 0,
            FieldValue::Unknown => k[at] = 1,
            FieldValue::Value(v) => {
                k[at] = 2;
                k[at + 1..at + 1 + w].copy_from_slice(&v.to_be_bytes()[16 - w..]);
            }
        }
        at += 1 + w;
    }
    k
}

fn be(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |a, &x| (a << 8) | u128::from(x))
}

/// Writes the key table of `keys`: per field a sorted dictionary of present values and one code per key
/// (0 missing, 1 unknown, 2 + dictionary index), packed in the fewest bits.
pub(crate) fn write_table(out: &mut Out, keys: &[Key]) {
    let mut at = 0;
    for f in KEY_FIELDS {
        let w = width(f);
        let mut dict: Vec<&[u8]> =
            keys.iter().filter(|k| k[at] == 2).map(|k| &k[at + 1..at + 1 + w]).collect::<Vec<_>>();
        dict.sort_unstable();
        dict.dedup();
        let bits = code_bits(dict.len());
        out.u32(dict.len() as u32);
        out.u32(bits);
        for v in &dict {
            out.bytes(v);
        }
        let mut packed = BitPacker::new(bits);
        for k in keys {
            let code = match k[at] {
                2 => 2 + dict.binary_search(&&k[at + 1..at + 1 + w]).expect("value is in the dictionary") as u64,
                t => u64::from(t),
            };
            packed.push(code);
        }
        out.bytes(&packed.finish());
        at += 1 + w;
    }
}

/// Bits of a code for a dictionary of `n` values.
fn code_bits(n: usize) -> u32 {
    let max = n as u64 + 1;
    64 - max.leading_zeros()
}

struct BitPacker {
    bits: u32,
    out: Vec<u8>,
    acc: u64,
    fill: u32,
}

impl BitPacker {
    fn new(bits: u32) -> BitPacker {
        BitPacker { bits, out: Vec::new(), acc: 0, fill: 0 }
    }

    fn push(&mut self, v: u64) {
        self.acc |= v << self.fill;
        self.fill += self.bits;
        while self.fill >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.fill -= 8;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        if self.fill > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

fn packed_len(n: usize, bits: u32) -> usize {
    (n * bits as usize).div_ceil(8)
}

/// One column of a key table.
#[derive(Clone, Copy, Debug)]
struct Column<'a> {
    field: Field,
    dict: &'a [u8],
    codes: &'a [u8],
    bits: u32,
}

impl Column<'_> {
    fn dict_len(&self) -> usize {
        self.dict.len() / width(self.field)
    }

    fn dict_value(&self, i: usize) -> u128 {
        let w = width(self.field);
        be(&self.dict[i * w..(i + 1) * w])
    }

    fn code(&self, k: usize) -> u64 {
        if self.bits == 0 {
            return 0;
        }
        let bit = k * self.bits as usize;
        let (byte, shift) = (bit / 8, bit % 8);
        let mut w = [0u8; 8];
        let end = (byte + 8).min(self.codes.len());
        w[..end - byte].copy_from_slice(&self.codes[byte..end]);
        (u64::from_le_bytes(w) >> shift) & ((1u64 << self.bits) - 1)
    }

    /// Every key's code, in order, unpacked as a stream.
    fn codes(&self, keys: usize) -> impl Iterator<Item = u64> + '_ {
        let bits = self.bits;
        let mask = if bits == 0 { 0 } else { u64::MAX >> (64 - bits) };
        let mut bytes = self.codes.iter();
        let (mut acc, mut fill) = (0u64, 0u32);
        (0..keys).map(move |_| {
            while fill < bits {
                acc |= u64::from(*bytes.next().unwrap_or(&0)) << fill;
                fill += 8;
            }
            let v = acc & mask;
            acc = acc.checked_shr(bits).unwrap_or(0);
            fill -= bits;
            v
        })
    }

    fn value(&self, k: usize) -> FieldValue {
        match self.code(k) {
            0 => FieldValue::Missing,
            1 => FieldValue::Unknown,
            c => FieldValue::Value(self.dict_value(c as usize - 2)),
        }
    }
}

/// The key table of a chunk, read from its bytes.
#[derive(Clone, Debug)]
pub(crate) struct KeyTable<'a> {
    keys: usize,
    columns: Vec<Column<'a>>,
}

impl<'a> KeyTable<'a> {
    /// Reads a table of `keys` keys; every code is checked against its dictionary.
    pub(crate) fn read(c: &mut Cursor<'a>, keys: usize) -> Result<KeyTable<'a>, String> {
        let mut columns = Vec::with_capacity(KEY_FIELDS.len());
        for field in KEY_FIELDS {
            let n = c.u32()? as usize;
            let bits = c.u32()?;
            if bits != code_bits(n) {
                return Err(format!("{} column: {bits} bits per code for {n} values", field.name()));
            }
            let dict = c.bytes(n.checked_mul(width(field)).ok_or("dictionary too large")?)?;
            let codes = c.bytes(packed_len(keys, bits))?;
            let col = Column { field, dict, codes, bits };
            for i in 1..n {
                if dict[(i - 1) * width(field)..i * width(field)] >= dict[i * width(field)..(i + 1) * width(field)] {
                    return Err(format!("{} dictionary is not sorted at entry {i}", field.name()));
                }
            }
            if let Some(k) = col.codes(keys).position(|code| code >= 2 + n as u64) {
                return Err(format!("{} code of key {k} is past the dictionary", field.name()));
            }
            columns.push(col);
        }
        Ok(KeyTable { keys, columns })
    }

    /// Keys in the table.
    pub(crate) fn len(&self) -> usize {
        self.keys
    }

    fn column(&self, f: Field) -> Option<&Column<'a>> {
        self.columns.iter().find(|c| c.field == f)
    }

    /// Which keys may satisfy `pred`, a predicate on a key field (others: every key may).
    pub(crate) fn eval(&self, pred: &Pred) -> Vec<bool> {
        let Some(col) = self.column(pred.field) else { return vec![true; self.keys] };
        // Truth per code: missing fails, unknown may, values as the predicate says.
        let mut truth = vec![false, true];
        truth.extend((0..col.dict_len()).map(|i| pred.holds(col.dict_value(i))));
        col.codes(self.keys).map(|c| truth[c as usize]).collect()
    }

    /// Which keys know `field` (present or missing, not unknown).
    pub(crate) fn known(&self, field: Field) -> Vec<bool> {
        match self.column(field) {
            None => vec![false; self.keys],
            Some(col) => col.codes(self.keys).map(|c| c != 1).collect(),
        }
    }

    /// The value of `field` in key `k`.
    #[cfg(test)]
    pub(crate) fn value(&self, k: usize, field: Field) -> FieldValue {
        self.column(field).map_or(FieldValue::Unknown, |c| c.value(k))
    }

    /// Whether key `k` is the key of these fields (the check that the trace still holds the indexed packet).
    pub(crate) fn is_key_of(&self, k: usize, fields: &PacketFields<'_>) -> bool {
        k < self.keys && self.columns.iter().all(|c| c.value(k) == fields.get(c.field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Cursor;
    use pcaptool_packet::LinkType;

    fn frame(src: [u8; 4], sport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[23] = 17;
        f[26..30].copy_from_slice(&src);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f
    }

    #[test]
    fn table_round_trip() {
        let frames = [frame([10, 0, 0, 1], 53), frame([10, 0, 0, 2], 53), frame([9, 9, 9, 9], 123)];
        let mut keys: Vec<Key> = frames
            .iter()
            .map(|f| key_of(&PacketFields::new(LinkType::ETHERNET, f, 60, 0)))
            .chain([key_of(&PacketFields::new(LinkType(101), &frames[0], 1500, 0))])
            .collect();
        keys.dedup();
        let mut out = Out::default();
        write_table(&mut out, &keys);
        let bytes = out.into_inner();
        let t = KeyTable::read(&mut Cursor::new(&bytes), keys.len()).unwrap();
        assert_eq!(t.value(0, Field::Ip4Src), FieldValue::Value(0x0a00_0001));
        assert_eq!(t.value(2, Field::SrcPort), FieldValue::Value(123));
        assert_eq!(t.value(1, Field::Ip6Src), FieldValue::Missing);
        assert_eq!(t.value(3, Field::Ip4Src), FieldValue::Unknown);
        let p = Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff);
        assert_eq!(t.eval(&p), vec![true, true, false, true]);
        let p = Pred::range(Field::WireLen, 1000, 1100);
        assert!((0..8).filter(|&c| class_may(c, &p)).eq([4, 5]));
        assert_eq!(len_class(1100), 5);
        for (k, f) in frames.iter().enumerate() {
            assert!(t.is_key_of(k, &PacketFields::new(LinkType::ETHERNET, f, 60, 0)));
        }
        assert!(!t.is_key_of(0, &PacketFields::new(LinkType::ETHERNET, &frames[1], 60, 0)));
        let syn = Pred { field: Field::TcpFlags, lo: 2, hi: 2, mask: 2 };
        assert!(!code_may(0, &syn) && code_may(1, &syn) && code_may(2 + 0x12, &syn) && !code_may(2 + 0x10, &syn));
    }
}
