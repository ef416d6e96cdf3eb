//! Packet keys: the header fields of one packet that stay the same along a flow direction, packed into a fixed
//! byte string, and the per-chunk key table that stores each distinct key once, column by column, with a sorted
//! dictionary per field. TCP flags and the wire-length class change from packet to packet; they are sequences of
//! their own (the flags code of [`key_and_flags`], [`len_class`]).

use pcaptool_packet::{Field, FieldValue, PacketFields, Pred};

use std::sync::OnceLock;

use crate::format::{BitPacker, Cursor, Damage, KeySet, Out, Packed, Part, packed_len};

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

/// The TCP flags of a packet as a sequence symbol ([`code_of`]), read alone (the definition
/// [`key_and_flags`] is tested against).
#[cfg(test)]
pub(crate) fn flags_code(fields: &PacketFields<'_>) -> u32 {
    code_of(fields.get(Field::TcpFlags))
}

/// Whether a sequence symbol ([`code_of`]) may satisfy `pred`; `cut_fails`: see [`unknown_may`].
pub(crate) fn code_may(code: u32, pred: &Pred, cut_fails: bool) -> bool {
    match code {
        0 => false,
        1 => unknown_may(pred, cut_fails),
        c => pred.holds(u128::from(c - 2)),
    }
}

/// Whether an unknown value may satisfy `pred`. A value is unknown when the packet was cut short before it (the
/// snapshot length) or when its link type has no header fields the index reads. With `cut_fails` (the caller
/// knows every packet's link type has header fields, so only the first cause is left), it fails a predicate
/// that loads all of its bytes unless every value satisfies it: libpcap rejects a packet when a load reaches past
/// the bytes captured (`Need::may_match_captured`).
pub(crate) fn unknown_may(pred: &Pred, cut_fails: bool) -> bool {
    !cut_fails || pred.always() || !pred.reads_whole_field()
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
#[cfg(test)]
pub(crate) fn key_of(fields: &PacketFields<'_>) -> Key {
    key_and_flags(fields).0
}

/// A packet's key and its TCP flags code (as a sequence symbol, [`code_of`]), with the link layer read once for
/// both.
pub(crate) fn key_and_flags(fields: &PacketFields<'_>) -> (Key, u32) {
    let r = fields.reader();
    let mut k = [0u8; KEY_BYTES];
    // One call per field with the field, its width and its place known at compile time: each folds to a few loads
    // and moves.
    macro_rules! put {
        ($($i:literal)*) => {$(
            put::<{ width(KEY_FIELDS[$i]) }>(&mut k, tag_at($i), r.get(KEY_FIELDS[$i]));
        )*};
    }
    const _: () = assert!(KEY_FIELDS.len() == 13, "one put per key field");
    put!(0 1 2 3 4 5 6 7 8 9 10 11 12);
    (k, code_of(r.get(Field::TcpFlags)))
}

/// Writes a field's tag at `k[at]` and its value, `W` bytes big-endian, after it.
#[inline(always)]
fn put<const W: usize>(k: &mut Key, at: usize, v: FieldValue) {
    match v {
        FieldValue::Missing => k[at] = 0,
        FieldValue::Unknown => k[at] = 1,
        FieldValue::Value(v) => {
            k[at] = 2;
            let b = v.to_be_bytes();
            let mut w = [0u8; W];
            w.copy_from_slice(&b[16 - W..]);
            k[at + 1..at + 1 + W].copy_from_slice(&w);
        }
    }
}

fn be(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |a, &x| (a << 8) | u128::from(x))
}

/// Byte offset in a [`Key`] of the tag of `KEY_FIELDS[i]`.
const fn tag_at(i: usize) -> usize {
    let mut at = 0;
    let mut j = 0;
    while j < i {
        at += 1 + width(KEY_FIELDS[j]);
        j += 1;
    }
    at
}

/// The order of keys in a table: by shape (IPv4 without ports, IPv4 with ports, IPv6 with ports, IPv6 without,
/// ARP, other, then keys with an unknown field), so that each field's present codes lie in one short range of
/// rows and the rows outside it cost nothing ([`write_column`]); ties keep the order of first appearance.
pub(crate) fn shape_rank(k: &Key) -> u8 {
    let tag = |f: Field| k[tag_at(KEY_FIELDS.iter().position(|&x| x == f).unwrap_or(0))];
    let (ip4, ip6, ports, arp) =
        (tag(Field::Ip4Src) == 2, tag(Field::Ip6Src) == 2, tag(Field::SrcPort) == 2, tag(Field::ArpSpa) == 2);
    if (0..KEY_FIELDS.len()).any(|i| k[tag_at(i)] == 1) {
        6
    } else if ip4 {
        u8::from(ports)
    } else if ip6 {
        if ports { 2 } else { 3 }
    } else if arp {
        4
    } else {
        5
    }
}

/// The field that holds, for a packet going the other way along a flow, what `f` holds for this one.
pub(crate) fn mirror(f: Field) -> Field {
    match f {
        Field::EthSrc => Field::EthDst,
        Field::EthDst => Field::EthSrc,
        Field::Ip4Src => Field::Ip4Dst,
        Field::Ip4Dst => Field::Ip4Src,
        Field::Ip6Src => Field::Ip6Dst,
        Field::Ip6Dst => Field::Ip6Src,
        Field::SrcPort => Field::DstPort,
        Field::DstPort => Field::SrcPort,
        Field::ArpSpa => Field::ArpTpa,
        Field::ArpTpa => Field::ArpSpa,
        f => f,
    }
}

/// The key of a packet going the other way: every field with its [`mirror`]'s tag and value.
pub(crate) fn reversed(k: &Key) -> Key {
    let mut r = [0u8; KEY_BYTES];
    for (i, f) in KEY_FIELDS.into_iter().enumerate() {
        let j = KEY_FIELDS.iter().position(|&x| x == mirror(f)).unwrap_or(i);
        let w = 1 + width(f);
        r[tag_at(i)..tag_at(i) + w].copy_from_slice(&k[tag_at(j)..tag_at(j) + w]);
    }
    r
}

/// Writes column `i` ([`KEY_FIELDS`]) of the key table of `keys`: for the rows from the first to the last whose field
/// is not missing, one code per row (0 missing, 1 unknown, 2 + v present), packed in the fewest bits; rows outside
/// that range are missing. `v` is an index into a sorted dictionary of the field's present values, or, when that
/// is smaller (a field of at most 4 bytes with nearly as many values as rows, such as client ports), the value
/// itself and no dictionary.
pub(crate) fn write_column(out: &mut Out, keys: &[Key], i: usize) {
    write_column_as(out, keys, i, None)
}

/// [`write_column`], with `raw` forcing one encoding or the other (`None`: the smaller).
fn write_column_as(out: &mut Out, keys: &[Key], i: usize, raw: Option<bool>) {
    let f = KEY_FIELDS[i];
    let (at, w) = (tag_at(i), width(f));
    let value = |k: &Key| be(&k[at + 1..at + 1 + w]);
    // Distinct values first (a few thousand of tens of thousands of rows), then sorted into the dictionary.
    let mut code_of: rustc_hash::FxHashMap<u128, u32> = rustc_hash::FxHashMap::default();
    for k in keys.iter().filter(|k| k[at] == 2) {
        code_of.entry(value(k)).or_insert(0);
    }
    let lo = keys.iter().position(|k| k[at] != 0).unwrap_or(0);
    let hi = keys.iter().rposition(|k| k[at] != 0).map_or(0, |h| h + 1);
    let unknown_lo = (lo..hi).find(|&r| keys[r][at] == 1).unwrap_or(hi);
    let dict_cost = code_of.len() * w * 8 + (hi - lo) * code_bits(code_of.len()) as usize;
    let raw = w <= RAW_MAX_WIDTH && raw.unwrap_or(((hi - lo) * raw_bits(w) as usize) < dict_cost);
    let mut dict: Vec<u128> = if raw { Vec::new() } else { code_of.keys().copied().collect() };
    dict.sort_unstable();
    for (c, v) in dict.iter().enumerate() {
        code_of.insert(*v, c as u32);
    }
    let bits = if raw { raw_bits(w) } else { code_bits(dict.len()) };
    out.u32(dict.len() as u32);
    out.u32(bits);
    out.u32(lo as u32);
    out.u32(hi as u32);
    out.u32(unknown_lo as u32);
    out.u32(u32::from(raw));
    for v in &dict {
        out.bytes(&v.to_be_bytes()[16 - w..]);
    }
    let mut packed = BitPacker::new(bits);
    for k in &keys[lo..hi] {
        packed.push(match k[at] {
            2 if raw => 2 + value(k) as u64,
            2 => 2 + u64::from(code_of[&value(k)]),
            t => u64::from(t),
        });
    }
    out.bytes(&packed.finish());
}

/// Widest field (bytes) a column may store as raw values.
const RAW_MAX_WIDTH: usize = 4;

/// Bits of a raw code of a field `w` bytes wide: its values and the two codes below them.
fn raw_bits(w: usize) -> u32 {
    8 * w as u32 + 1
}

/// Bits of a code for a dictionary of `n` values.
fn code_bits(n: usize) -> u32 {
    let max = n as u64 + 1;
    64 - max.leading_zeros()
}

/// One column of a key table.
#[derive(Clone, Copy, Debug)]
struct Column<'a> {
    field: Field,
    dict: &'a [u8],
    /// Whether codes hold values (`2 + v`), not dictionary indexes.
    raw: bool,
    /// Codes of rows `lo..hi`; the other rows are missing (code 0).
    codes: Packed<'a>,
    bits: u32,
    lo: usize,
    hi: usize,
    /// First row whose code is unknown (`hi`: none).
    unknown_lo: usize,
}

impl<'a> Column<'a> {
    /// Reads the column of `field` from its part, checking its layout and that its dictionary is sorted; codes
    /// are read in place (one past the dictionary reads as unknown).
    fn read(b: &'a [u8], field: Field, rows: usize) -> Result<Column<'a>, String> {
        let mut c = Cursor::new(b);
        let n = c.u32()? as usize;
        let bits = c.u32()?;
        let (lo, hi) = (c.u32()? as usize, c.u32()? as usize);
        let unknown_lo = c.u32()? as usize;
        let raw = match c.u32()? {
            0 => false,
            1 => true,
            m => return Err(format!("column encoding {m}")),
        };
        let w = width(field);
        if raw && (w > RAW_MAX_WIDTH || n != 0 || bits != raw_bits(w)) {
            return Err(format!("raw codes of {bits} bits with {n} dictionary values for a {w}-byte field"));
        }
        if !raw && bits != code_bits(n) {
            return Err(format!("{bits} bits per code for {n} values"));
        }
        if lo > hi || hi > rows || !(lo..=hi).contains(&unknown_lo) {
            return Err(format!("rows {lo}..{hi} (unknown from {unknown_lo}) of a {rows}-row table"));
        }
        let dict = c.bytes(n.checked_mul(w).ok_or("dictionary too large")?)?;
        let codes = Packed::new(c.bytes(packed_len(hi - lo, bits))?, bits, hi - lo);
        if !c.is_empty() {
            return Err(format!("{} bytes after the codes", b.len() - c.pos()));
        }
        if let Some(i) = (1..n).find(|&i| dict[(i - 1) * w..i * w] >= dict[i * w..(i + 1) * w]) {
            return Err(format!("dictionary is not sorted at entry {i}"));
        }
        Ok(Column { field, dict, raw, codes, bits, lo, hi, unknown_lo })
    }

    /// Dictionary value `i`, if there is one.
    fn dict_value(&self, i: usize) -> Option<u128> {
        let w = width(self.field);
        self.dict.get(i * w..(i + 1) * w).map(be)
    }

    fn code(&self, k: usize) -> u64 {
        if self.bits == 0 || !(self.lo..self.hi).contains(&k) {
            return 0;
        }
        self.codes.get(k - self.lo)
    }

    /// The value of raw code `c` (`c >= 2`): `None` for a value wider than the field, which only damage the
    /// checksum did not catch can store (read as unknown, as a code past a dictionary is).
    fn raw_value(&self, c: u64) -> Option<u128> {
        let v = c - 2;
        (v >> (8 * width(self.field)) == 0).then_some(u128::from(v))
    }

    fn value(&self, k: usize) -> FieldValue {
        match self.code(k) {
            0 => FieldValue::Missing,
            1 => FieldValue::Unknown,
            c if self.raw => self.raw_value(c).map_or(FieldValue::Unknown, FieldValue::Value),
            // A code past the dictionary (damage the checksum did not catch) is unknown: any test may match, and
            // a packet read with it is refused as not the packet the index describes.
            c => self.dict_value(c as usize - 2).map_or(FieldValue::Unknown, FieldValue::Value),
        }
    }

    /// Calls `f(row)` for every row whose value may satisfy `pred` (missing fails, unknown may). A dictionary
    /// column tests each dictionary value once and then reads the codes (a code past the dictionary, which only
    /// damage the checksum missed can store, is accepted), and when no value satisfies `pred` reads only the rows
    /// from the first unknown one (unknown fields are in the last rows of a table); a raw column tests each row's
    /// value.
    fn rows_matching(&self, pred: &Pred, cut_fails: bool, f: impl FnMut(usize)) {
        let unknown = unknown_may(pred, cut_fails);
        if self.raw {
            let may = |c: u64| (c == 1 && unknown) || (c > 1 && self.raw_value(c).is_none_or(|v| pred.holds(v)));
            return self.rows_where(self.lo, may, f);
        }
        // Truth per code: missing fails, unknown as `unknown_may` says, then each dictionary value (a code past the
        // dictionary, only damage can store, may).
        let mut truth = vec![false, unknown];
        truth.extend(
            (0..self.dict.len() / width(self.field)).map(|i| self.dict_value(i).is_some_and(|v| pred.holds(v))),
        );
        let from = if truth[2..].iter().any(|&x| x) { self.lo } else { self.unknown_lo };
        self.rows_where(from, |c| truth.get(c as usize).copied().unwrap_or(true), f)
    }

    /// Calls `f(row)` for every row whose value is unknown.
    fn unknown_rows(&self, f: impl FnMut(usize)) {
        self.rows_where(self.unknown_lo, |c| c == 1, f)
    }

    /// Calls `f(row)` for every row from `from` whose code `accept` takes.
    fn rows_where(&self, from: usize, accept: impl Fn(u64) -> bool, mut f: impl FnMut(usize)) {
        if from >= self.hi {
            return;
        }
        for (j, code) in self.codes.iter_from(from - self.lo).enumerate() {
            if accept(code) {
                f(from + j);
            }
        }
    }
}

/// The key table of a chunk: one column per field of [`KEY_FIELDS`], each its own part, read when first used.
/// Each row is a flow: key `2·row` is the row as stored, key `2·row + 1` the same flow the other way (every field
/// read from its [`mirror`]).
#[derive(Debug)]
pub(crate) struct KeyTable<'a> {
    rows: usize,
    parts: Vec<Part<'a>>,
    columns: Vec<OnceLock<Result<Column<'a>, Damage>>>,
    /// Rows whose code in a column satisfies a predicate, for recent (column, predicate) pairs: `host X` reads
    /// each address column for both of its predicates (one per direction).
    scans: std::sync::Mutex<Vec<Scan>>,
    /// Whether an unknown value is one cut short by the snapshot length (see [`unknown_may`]).
    pub(crate) cut_fails: bool,
}

/// A column scan remembered: the rows whose code in `Field`'s column satisfies `Pred`.
type Scan = (Field, Pred, std::sync::Arc<Vec<u32>>);

impl<'a> KeyTable<'a> {
    /// A table of `rows` rows over its column parts (in [`KEY_FIELDS`] order).
    pub(crate) fn new(rows: usize, parts: Vec<Part<'a>>) -> KeyTable<'a> {
        let columns = parts.iter().map(|_| OnceLock::new()).collect();
        KeyTable { rows, parts, columns, scans: std::sync::Mutex::new(Vec::new()), cut_fails: false }
    }

    /// Keys in the table (two per row).
    pub(crate) fn len(&self) -> usize {
        2 * self.rows
    }

    fn column(&self, f: Field) -> Result<&Column<'a>, Damage> {
        let i = KEY_FIELDS.iter().position(|&x| x == f).unwrap_or(0);
        let part = &self.parts[i];
        self.columns[i]
            .get_or_init(|| {
                let what = format!("{} column", f.name());
                let b = part.get(&what)?;
                Column::read(b, f, self.rows).map_err(|why| part.damage(&what, why))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Checks every column (for a caller that reads whole keys).
    pub(crate) fn check(&self) -> Result<(), Damage> {
        KEY_FIELDS.iter().try_for_each(|&f| self.column(f).map(|_| ()))
    }

    /// Which keys may satisfy `pred`, a predicate on a key field (others: every key may).
    pub(crate) fn eval(&self, pred: &Pred) -> Result<KeySet, Damage> {
        if !KEY_FIELDS.contains(&pred.field) {
            return Ok(KeySet::new(self.len(), true));
        }
        let mut out = KeySet::new(self.len(), false);
        for (f, dir) in [(pred.field, 0), (mirror(pred.field), 1)] {
            for &row in self.scan(f, pred)?.iter() {
                out.insert(2 * row as usize + dir);
            }
        }
        Ok(out)
    }

    /// The rows whose code in column `f` may satisfy `pred` (a predicate on `f` or its mirror), remembered.
    fn scan(&self, f: Field, pred: &Pred) -> Result<std::sync::Arc<Vec<u32>>, Damage> {
        let lock = || self.scans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((.., rows)) =
            lock().iter().find(|(g, p, _)| *g == f && p.lo == pred.lo && p.hi == pred.hi && p.mask == pred.mask)
        {
            return Ok(rows.clone());
        }
        let col = self.column(f)?;
        // Rows outside a column's stored range are missing, which fails: only the stored codes are read.
        let mut rows = Vec::new();
        col.rows_matching(pred, self.cut_fails, |row| rows.push(row as u32));
        let rows = std::sync::Arc::new(rows);
        let mut scans = lock();
        if scans.len() >= 64 {
            scans.remove(0);
        }
        scans.push((f, *pred, rows.clone()));
        Ok(rows)
    }

    /// Which keys of `domain` may satisfy `pred` (keys outside it are not asked): one value read per key, for a
    /// domain much smaller than the table.
    pub(crate) fn eval_in(&self, pred: &Pred, domain: &KeySet) -> Result<KeySet, Damage> {
        if !KEY_FIELDS.contains(&pred.field) {
            return Ok(domain.clone());
        }
        let cols = [self.column(pred.field)?, self.column(mirror(pred.field))?];
        let mut out = KeySet::new(self.len(), false);
        let unknown = unknown_may(pred, self.cut_fails);
        for k in domain.iter() {
            let col = cols[k % 2];
            let may = match col.value(k / 2) {
                FieldValue::Missing => false,
                // (Code 1 is unknown; a code past the dictionary, only damage can store, may.)
                FieldValue::Unknown => unknown || col.code(k / 2) != 1,
                FieldValue::Value(v) => pred.holds(v),
            };
            if may {
                out.insert(k);
            }
        }
        Ok(out)
    }

    /// Which keys know `field` (present or missing, not unknown).
    pub(crate) fn known(&self, field: Field) -> Result<KeySet, Damage> {
        let mut out = KeySet::new(self.len(), true);
        for (f, dir) in [(field, 0), (mirror(field), 1)] {
            self.column(f)?.unknown_rows(|row| out.remove(2 * row + dir));
        }
        Ok(out)
    }

    /// The value of `field` in key `k`.
    pub(crate) fn value(&self, k: usize, field: Field) -> Result<FieldValue, Damage> {
        let f = if k % 2 == 1 { mirror(field) } else { field };
        Ok(self.column(f)?.value(k / 2))
    }

    /// Whether key `k` is `key`, a packet's packed key ([`key_and_flags`]: the check that the trace still holds
    /// the indexed packet), the keys checked before taken from `memo` (the packets of a flow read one after another
    /// share their key: its columns are then read once, not once a packet).
    pub(crate) fn is_key_with(&self, k: usize, key: &Key, memo: &mut KeyMemo) -> Result<bool, Damage> {
        if k >= self.len() {
            return Ok(false);
        }
        let want = match memo.0.get(&(k as u32)) {
            Some(v) => v,
            None => {
                let mut v = [FieldValue::Missing; KEY_FIELDS.len()];
                for (x, f) in v.iter_mut().zip(KEY_FIELDS) {
                    *x = self.value(k, f)?;
                }
                memo.0.entry(k as u32).or_insert(pack(v))
            }
        };
        Ok(want == key)
    }
}

/// The packed keys a reader checked packets against, by key id (see [`KeyTable::is_key_with`]).
#[derive(Debug, Default)]
pub(crate) struct KeyMemo(rustc_hash::FxHashMap<u32, Key>);

/// The packed key of the values of [`KEY_FIELDS`], as [`key_and_flags`] packs a packet's.
fn pack(values: [FieldValue; KEY_FIELDS.len()]) -> Key {
    let mut k = [0u8; KEY_BYTES];
    macro_rules! put {
        ($($i:literal)*) => {$(
            put::<{ width(KEY_FIELDS[$i]) }>(&mut k, tag_at($i), values[$i]);
        )*};
    }
    put!(0 1 2 3 4 5 6 7 8 9 10 11 12);
    k
}

/// Pairs the keys of a chunk into flows: returns the rows (each a key whose reverse, if the chunk holds it, is
/// the row's second key) and, per key, its key id `2·row + direction`. Rows are ordered by [`shape_rank`], then
/// by first appearance.
pub(crate) fn pair_keys(keys: &[Key]) -> (Vec<Key>, Vec<u32>) {
    let index: rustc_hash::FxHashMap<&Key, u32> = keys.iter().enumerate().map(|(i, k)| (k, i as u32)).collect();
    // Per key: (row leader, direction).
    let mut partner = vec![u32::MAX; keys.len()];
    let mut leaders = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if partner[i] != u32::MAX {
            continue;
        }
        partner[i] = i as u32;
        leaders.push(i as u32);
        if let Some(&j) = index.get(&reversed(k))
            && partner[j as usize] == u32::MAX
        {
            partner[j as usize] = i as u32;
        }
    }
    leaders.sort_by_key(|&l| shape_rank(&keys[l as usize]));
    let mut row_of = vec![0u32; keys.len()];
    for (row, &l) in leaders.iter().enumerate() {
        row_of[l as usize] = row as u32;
    }
    let ids = (0..keys.len()).map(|i| 2 * row_of[partner[i] as usize] + u32::from(partner[i] != i as u32)).collect();
    (leaders.iter().map(|&l| keys[l as usize]).collect(), ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcaptool_packet::LinkType;
    use proptest::prelude::*;

    proptest::proptest! {
        /// The key and flags code equal their definition read field by field with `get`.
        #[test]
        fn key_and_flags_read_every_field_as_get_does(
            mut frame in proptest::collection::vec(any::<u8>(), 0..80),
            ether in proptest::sample::select(vec![0x0800u16, 0x86dd, 0x0806, 0x8035, 0x8100, 0x1234]),
            proto in proptest::sample::select(vec![6u8, 17, 132, 1]),
        ) {
            if frame.len() >= 14 {
                frame[12..14].copy_from_slice(&ether.to_be_bytes());
            }
            for at in [20, 23] {
                if frame.len() > at {
                    frame[at] = proto;
                }
            }
            let fields = PacketFields::new(LinkType::ETHERNET, &frame, 99, 5);
            let mut want = Vec::new();
            for f in KEY_FIELDS {
                match fields.get(f) {
                    FieldValue::Missing => want.push(0),
                    FieldValue::Unknown => want.push(1),
                    FieldValue::Value(v) => {
                        want.push(2);
                        want.extend_from_slice(&v.to_be_bytes()[16 - width(f)..]);
                        continue;
                    }
                }
                want.extend(std::iter::repeat_n(0, width(f)));
            }
            let (key, flags) = key_and_flags(&fields);
            proptest::prop_assert_eq!(&key[..], &want[..]);
            proptest::prop_assert_eq!(flags, flags_code(&fields));
        }
    }

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
            .chain([key_of(&PacketFields::new(LinkType(147), &frames[0], 1500, 0))])
            .collect();
        keys.dedup();
        // The first key's reverse joins its row.
        keys.push(reversed(&keys[0]));
        let (rows, ids) = pair_keys(&keys);
        assert_eq!(rows.len(), 4);
        assert_eq!(ids[4], ids[0] + 1, "the reverse is the row's second key");
        assert_eq!(ids[3], 6, "the key with unknown fields is the last row");
        let columns: Vec<Vec<u8>> = (0..KEY_FIELDS.len())
            .map(|i| {
                let mut out = Out::default();
                write_column(&mut out, &rows, i);
                out.into_inner()
            })
            .collect();
        let parts = columns.iter().map(|c| Part::new(c, 0, crate::format::crc32(c))).collect();
        let t = KeyTable::new(rows.len(), parts);
        let id = |k: usize| ids[k] as usize;
        let v = |k: usize, f: Field| t.value(id(k), f).unwrap();
        assert_eq!(v(0, Field::Ip4Src), FieldValue::Value(0x0a00_0001));
        assert_eq!(v(4, Field::Ip4Dst), FieldValue::Value(0x0a00_0001));
        assert_eq!(v(4, Field::DstPort), FieldValue::Value(53));
        assert_eq!(v(2, Field::SrcPort), FieldValue::Value(123));
        assert_eq!(v(1, Field::Ip6Src), FieldValue::Missing);
        assert_eq!(v(3, Field::Ip4Src), FieldValue::Unknown);
        let p = Pred::range(Field::Ip4Src, 0x0a00_0000, 0x0aff_ffff);
        let truth = t.eval(&p).unwrap();
        assert_eq!(truth.len(), 8);
        assert!([0, 1, 3].iter().all(|&k| truth.contains(id(k))) && !truth.contains(id(2)) && !truth.contains(id(4)));
        let p = Pred::range(Field::WireLen, 1000, 1100);
        assert!((0..8).filter(|&c| class_may(c, &p)).eq([4, 5]));
        assert_eq!(len_class(1100), 5);
        // A predicate no value satisfies matches only the unknown row, whatever its other fields.
        let none = t.eval(&Pred::range(Field::Ip4Src, 1, 1)).unwrap();
        assert_eq!(none.iter().collect::<Vec<_>>(), vec![id(3), id(3) + 1]);
        // (One memo throughout: a key's values remembered from one packet are still checked against the next.)
        let mut memo = KeyMemo::default();
        let mut is_key_of =
            |k, f| t.is_key_with(k, &key_of(&PacketFields::new(LinkType::ETHERNET, f, 60, 0)), &mut memo);
        for (k, f) in frames.iter().enumerate() {
            assert!(is_key_of(id(k), f).unwrap());
        }
        assert!(!is_key_of(id(0), &frames[1]).unwrap());
        assert!(!is_key_of(8, &frames[1]).unwrap());
        assert!(is_key_of(id(0), &frames[0]).unwrap());
        // A damaged column is an error naming it.
        let mut bad = columns[4].clone();
        bad[0] ^= 1;
        let parts = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 4 {
                    Part::new(&bad, 77, crate::format::crc32(c))
                } else {
                    Part::new(c, 0, crate::format::crc32(c))
                }
            })
            .collect();
        let t = KeyTable::new(rows.len(), parts);
        let e = t.eval(&Pred::range(Field::Ip4Src, 0, 1)).unwrap_err();
        assert_eq!(e.offset, 77);
        assert!(e.why.contains("IPv4 source") || e.why.contains("column"), "{}", e.why);
        let syn = Pred { field: Field::TcpFlags, lo: 2, hi: 2, mask: 2 };
        assert!(
            !code_may(0, &syn, false)
                && code_may(1, &syn, false)
                && code_may(2 + 0x12, &syn, false)
                && !code_may(2 + 0x10, &syn, false)
        );
    }

    proptest! {
        /// A column answers the same stored as raw values or through its dictionary.
        #[test]
        fn raw_and_dictionary_columns_agree(
            flows in prop::collection::vec((0u8..4, 0u16..8, any::<u16>(), any::<bool>()), 1..60),
            lo in any::<u16>(),
            span in any::<u16>(),
        ) {
            let keys: Vec<Key> = flows
                .iter()
                .map(|&(host, sport_hi, sport, unknown)| {
                    let f = frame([10, 0, 0, host], (sport_hi << 13) | (sport % 64));
                    let link = if unknown { LinkType(147) } else { LinkType::ETHERNET };
                    key_of(&PacketFields::new(link, &f, if sport % 3 == 0 { 20 } else { 60 }, 0))
                })
                .collect();
            let (rows, _) = pair_keys(&keys);
            for (i, f) in KEY_FIELDS.into_iter().enumerate() {
                if width(f) > RAW_MAX_WIDTH {
                    continue;
                }
                let read = |raw: bool| {
                    let mut out = Out::default();
                    write_column_as(&mut out, &rows, i, Some(raw));
                    out.into_inner()
                };
                let (a, b) = (read(true), read(false));
                let (a, b) = (Column::read(&a, f, rows.len()).unwrap(), Column::read(&b, f, rows.len()).unwrap());
                prop_assert!(a.raw && !b.raw);
                for r in 0..rows.len() {
                    prop_assert_eq!(a.value(r), b.value(r));
                }
                let hi = (u128::from(lo) + u128::from(span)).min((1u128 << (8 * width(f))) - 1);
                let pred = Pred::range(f, u128::from(lo).min(hi), hi);
                let rows_of = |c: &Column<'_>, unknown: bool| {
                    let mut v = Vec::new();
                    if unknown { c.unknown_rows(|r| v.push(r)) } else { c.rows_matching(&pred, false, |r| v.push(r)) }
                    v
                };
                prop_assert_eq!(rows_of(&a, false), rows_of(&b, false));
                prop_assert_eq!(rows_of(&a, true), rows_of(&b, true));
            }
        }
    }

    #[test]
    fn a_raw_code_wider_than_its_field_reads_as_unknown() {
        // One row of a raw IPv4 source column (33-bit codes) whose code holds a value with a bit past its 4
        // bytes, which only damage can store: unknown, so a read packet's known address is not its key, and a
        // predicate may hold on it (as on a code past a dictionary).
        let mut b = Vec::new();
        for w in [0, raw_bits(4), 0, 1, 1, 1] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&(2u64 + (1 << 32) + 7).to_le_bytes()[..5]);
        let col = Column::read(&b, Field::Ip4Src, 1).unwrap();
        assert_eq!(col.value(0), FieldValue::Unknown);
        let mut rows = Vec::new();
        col.rows_matching(&Pred::range(Field::Ip4Src, 7, 7), true, |r| rows.push(r));
        assert_eq!(rows, vec![0]);
        // A value that fits is read as stored.
        b[24..29].copy_from_slice(&(2u64 + 7).to_le_bytes()[..5]);
        assert_eq!(Column::read(&b, Field::Ip4Src, 1).unwrap().value(0), FieldValue::Value(7));
    }

    #[test]
    fn reversing_twice_is_the_key() {
        let k = key_of(&PacketFields::new(LinkType::ETHERNET, &frame([10, 0, 0, 1], 53), 60, 0));
        assert_ne!(reversed(&k), k);
        assert_eq!(reversed(&reversed(&k)), k);
    }
}
