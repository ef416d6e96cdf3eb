//! The compiled matcher: a [`Cond`] flattened into jump code with fused load-and-test instructions.
//!
//! Each test instruction loads (from a fixed offset, or after a variable IPv4 header), masks, compares and jumps
//! to one of two instructions; `and`, `or` and `not` become jump targets and cost nothing at run time. The first
//! two instructions are "match" and "no match". A load past the captured bytes jumps to "no match", as in BPF.

use crate::prog::{Alu, Cond, Packet, Test, Val};

const ACCEPT: u32 = 0;
const REJECT: u32 = 1;

#[derive(Clone, Debug)]
enum Insn {
    Ret(bool),
    /// `test(pkt[off:size] & mask, k)`.
    Abs {
        off: u32,
        size: u8,
        mask: u32,
        test: Test,
        k: u32,
        jt: u32,
        jf: u32,
        /// From a relation: not related to other tests by jump threading.
        rel: bool,
        /// For a relation, the constant index of `proto[index]` (part of what libpcap numbers the load by).
        split: u32,
    },
    /// `test(pkt[4*(pkt[msh]&0xf) + off : size] & mask, k)`: a field after an IPv4 header.
    Tran {
        msh: u32,
        off: u32,
        size: u8,
        mask: u32,
        test: Test,
        k: u32,
        jt: u32,
        jf: u32,
        rel: bool,
    },
    /// `test(len & mask, k)`.
    Len {
        mask: u32,
        test: Test,
        k: u32,
        jt: u32,
        jf: u32,
    },
    /// Any other value against a constant.
    Gen {
        v: Val,
        test: Test,
        k: u32,
        jt: u32,
        jf: u32,
    },
    /// Two computed values.
    GenX {
        a: Val,
        test: Test,
        b: Val,
        jt: u32,
        jf: u32,
    },
    /// Computes a value (libpcap's variable header offsets, at the start of the program), then goes on.
    Touch {
        v: Val,
        next: u32,
    },
    /// The timestamp at or after (`after`) or before `t`.
    Time {
        after: bool,
        t: u64,
        jt: u32,
        jf: u32,
    },
}

/// What a path through the program has established about a loaded value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    /// Offset, size, mask, and whether a relation loaded it (libpcap's relations load through the index
    /// register, which gives them other value numbers than the same field tested by a primitive).
    Abs(u32, u8, u32, Option<u32>),
    Tran(u32, u32, u8, u32, bool),
    Len(u32),
    /// A computed value (by structure): libpcap numbers equal computations alike.
    Expr(u64),
    /// A comparison of two computed values (by structure).
    ExprX(u64),
}

/// Whether a value loads at an offset that depends on a header of variable length (802.11 after radiotap, PPI).
fn variable(v: &Val) -> bool {
    v.any(&|x| matches!(x, Val::Wlan { .. } | Val::PrefixLen))
}

fn structural<T: std::hash::Hash>(v: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// The outcome of a test on the way to an instruction: `test(key, k)` was `sense`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Fact {
    key: Key,
    test: Test,
    k: u32,
    sense: bool,
}

impl Insn {
    /// The value tested, the test and the constant, for instructions whose value jump threading can follow.
    fn test(&self) -> Option<(Key, Test, u32)> {
        match *self {
            Insn::Abs { off, size, mask, test, k, rel, split, .. } => {
                Some((Key::Abs(off, size, mask, if rel { Some(split) } else { None }), test, k))
            }
            Insn::Tran { msh, off, size, mask, test, k, rel, .. } => {
                Some((Key::Tran(msh, off, size, mask, rel), test, k))
            }
            Insn::Len { mask, test, k, .. } => Some((Key::Len(mask), test, k)),
            // Constants come from folding libpcap does only after branches stop moving.
            Insn::Gen { v: Val::K(_), .. } | Insn::GenX { a: Val::K(_), b: Val::K(_), .. } => None,
            // Loads after a header of variable length go through BPF's X register, reloaded from scratch memory in
            // every block; libpcap's optimiser does not thread jumps across them.
            Insn::Gen { ref v, .. } if variable(v) => None,
            Insn::Gen { ref v, test, k, .. } => Some((Key::Expr(structural(v)), test, k)),
            Insn::GenX { ref a, test, ref b, .. } => Some((Key::ExprX(structural(&(a, b))), test, 0)),
            _ => None,
        }
    }

    fn targets(&self) -> Option<(u32, u32)> {
        match *self {
            Insn::Ret(_) => None,
            Insn::Touch { next, .. } => Some((next, next)),
            Insn::Abs { jt, jf, .. }
            | Insn::Tran { jt, jf, .. }
            | Insn::Len { jt, jf, .. }
            | Insn::Gen { jt, jf, .. }
            | Insn::GenX { jt, jf, .. }
            | Insn::Time { jt, jf, .. } => Some((jt, jf)),
        }
    }

    fn set_target(&mut self, which: bool, to: u32) {
        match self {
            Insn::Ret(_) => {}
            Insn::Touch { next, .. } => *next = to,
            Insn::Abs { jt, jf, .. }
            | Insn::Tran { jt, jf, .. }
            | Insn::Len { jt, jf, .. }
            | Insn::Gen { jt, jf, .. }
            | Insn::GenX { jt, jf, .. }
            | Insn::Time { jt, jf, .. } => *(if which { jt } else { jf }) = to,
        }
    }
}

/// libpcap's `fold_edge`: whether a fact decides the test of `child`, and where it then goes.
fn fold(child: &Insn, f: &Fact) -> Option<u32> {
    let (key, test, k) = child.test()?;
    let (jt, jf) = child.targets()?;
    if key != f.key || test != f.test {
        return None;
    }
    if k == f.k {
        return Some(if f.sense { jt } else { jf });
    }
    // Equal to one constant, so not equal to another.
    (f.sense && test == Test::Eq).then_some(jf)
}

/// Instructions reachable from `entry`, in topological order (the code is acyclic).
fn reachable(code: &[Insn], entry: u32) -> Vec<u32> {
    fn visit(code: &[Insn], n: u32, seen: &mut [bool], out: &mut Vec<u32>) {
        if std::mem::replace(&mut seen[n as usize], true) {
            return;
        }
        if let Some((jt, jf)) = code[n as usize].targets() {
            visit(code, jt, seen, out);
            visit(code, jf, seen, out);
        }
        out.push(n);
    }
    let mut seen = vec![false; code.len()];
    let mut out = Vec::new();
    visit(code, entry, &mut seen, &mut out);
    out.reverse();
    out
}

/// Predecessor edges of every reachable instruction: (predecessor, whether it is the true branch).
fn in_edges(code: &[Insn], order: &[u32]) -> Vec<Vec<(u32, bool)>> {
    let mut preds = vec![Vec::new(); code.len()];
    for &n in order {
        if let Some((jt, jf)) = code[n as usize].targets() {
            preds[jt as usize].push((n, true));
            preds[jf as usize].push((n, false));
        }
    }
    preds
}

/// Block dominators over the reachable code (a bit set per instruction).
fn dominators(code: &[Insn], order: &[u32], preds: &[Vec<(u32, bool)>]) -> Vec<Vec<u64>> {
    let words = code.len().div_ceil(64);
    let mut dom = vec![vec![u64::MAX; words]; code.len()];
    for (i, &n) in order.iter().enumerate() {
        let mut d = if i == 0 {
            vec![0u64; words]
        } else {
            let mut acc = vec![u64::MAX; words];
            for &(p, _) in &preds[n as usize] {
                for (a, b) in acc.iter_mut().zip(&dom[p as usize]) {
                    *a &= b;
                }
            }
            acc
        };
        d[n as usize / 64] |= 1 << (n % 64);
        dom[n as usize] = d;
    }
    dom
}

fn dominated_by(dom: &[Vec<u64>], n: u32, by: u32) -> bool {
    dom[n as usize][by as usize / 64] & (1 << (by % 64)) != 0
}

/// libpcap's `or_pullup` (`along_false`) and `and_pullup`: in a chain of tests linked by their false (true)
/// branches that all share one true (false) target, a later test of the value the chain's predecessor tested is
/// moved up next to it, so that tests of one field run together. This changes which loads a short packet
/// reaches, as it does in libpcap. Returns whether the code changed.
fn pullup(code: &mut [Insn], preds: &[Vec<(u32, bool)>], dom: &[Vec<u64>], b: u32, along_false: bool) -> bool {
    let key = |n: u32| code[n as usize].test().map(|t| t.0);
    let Some(&(p0, w0)) = preds[b as usize].first() else { return false };
    let val = key(p0);
    if val.is_none() || preds[b as usize].iter().any(|&(p, _)| key(p) != val) {
        return false;
    }
    let shared = |n: u32| code[n as usize].targets().map(|(t, f)| if along_false { t } else { f });
    let next = |n: u32| code[n as usize].targets().map(|(t, f)| if along_false { f } else { t });
    let target_of = |code: &[Insn], (n, which): (u32, bool)| {
        let (t, f) = code[n as usize].targets().unwrap_or((n, n));
        if which { t } else { f }
    };
    let common = shared(b);
    let mut diff = (p0, w0);
    let mut at_top = true;
    loop {
        let n = target_of(code, diff);
        if code[n as usize].targets().is_none() || shared(n) != common || !dominated_by(dom, n, b) {
            return false;
        }
        if key(n) != val {
            break;
        }
        diff = (n, !along_false);
        at_top = false;
    }
    let mut same = (target_of(code, diff), !along_false);
    let pull = loop {
        let n = target_of(code, same);
        if code[n as usize].targets().is_none() || shared(n) != common || !dominated_by(dom, n, b) {
            return false;
        }
        if key(n) == val {
            break n;
        }
        same = (n, !along_false);
    };
    let after = next(pull).unwrap_or(pull);
    let (sn, sw) = same;
    code[sn as usize].set_target(sw, after);
    let first = target_of(code, diff);
    code[pull as usize].set_target(!along_false, first);
    if at_top {
        for &(p, w) in &preds[b as usize] {
            code[p as usize].set_target(w, pull);
        }
    } else {
        code[diff.0 as usize].set_target(diff.1, pull);
    }
    true
}

/// One pass of pullups over the reachable code, nearest the leaves first; stops at the first change.
fn pullups(code: &mut [Insn], entry: u32) -> bool {
    let order = reachable(code, entry);
    let preds = in_edges(code, &order);
    let dom = dominators(code, &order, &preds);
    // Heights: 0 for the returns, 1 + the higher branch otherwise.
    let mut height = vec![0u32; code.len()];
    for &n in order.iter().rev() {
        if let Some((jt, jf)) = code[n as usize].targets() {
            height[n as usize] = 1 + height[jt as usize].max(height[jf as usize]);
        }
    }
    let mut by_level: Vec<u32> = order.iter().copied().filter(|&n| height[n as usize] >= 1).collect();
    by_level.sort_by_key(|&n| height[n as usize]);
    for &b in &by_level {
        if pullup(code, &preds, &dom, b, true) || pullup(code, &preds, &dom, b, false) {
            return true;
        }
    }
    false
}

/// Jump threading, as libpcap's optimiser does it: an edge whose target's test is decided by what is known on
/// every path to the edge (the same test made before, or an equality with another constant that held) is
/// redirected past that target, and a test whose branches meet is skipped. Returns the new entry.
///
/// Skipping a decided test removes no failing load (its value was loaded on the way). Skipping a test whose
/// branches meet does: as in libpcap, a packet too short for that test is then not refused because of it.
fn thread_jumps(code: &mut [Insn], entry: u32) -> u32 {
    for _round in 0..64 {
        let order = reachable(code, entry);
        let mut known: Vec<Option<Vec<Fact>>> = vec![None; code.len()];
        known[entry as usize] = Some(Vec::new());
        let edge_facts = |code: &[Insn], n: u32, known: &[Option<Vec<Fact>>]| {
            let base = known[n as usize].clone().unwrap_or_default();
            let (jt, jf) = code[n as usize].targets().unwrap_or((n, n));
            let with = |sense: bool| {
                let mut f = base.clone();
                if let Some((key, test, k)) = code[n as usize].test() {
                    let fact = Fact { key, test, k, sense };
                    if !f.contains(&fact) {
                        f.push(fact);
                    }
                }
                f
            };
            [(jt, with(true)), (jf, with(false))]
        };
        for &n in &order {
            if code[n as usize].targets().is_none() {
                continue;
            }
            for (succ, f) in edge_facts(code, n, &known) {
                let slot = &mut known[succ as usize];
                *slot = Some(match slot.take() {
                    None => f,
                    Some(mut g) => {
                        g.retain(|x| f.contains(x));
                        g
                    }
                });
            }
        }
        let mut changed = false;
        for &n in &order {
            if code[n as usize].targets().is_none() {
                continue;
            }
            for (which, (succ, f)) in [true, false].into_iter().zip(edge_facts(code, n, &known)) {
                let mut to = succ;
                let mut steps = 0;
                while let Some(next) = f.iter().find_map(|fact| fold(&code[to as usize], fact)) {
                    to = next;
                    steps += 1;
                    if steps > code.len() {
                        break;
                    }
                }
                // A test whose two branches go to the same place decides nothing: skip it (libpcap's optimiser
                // does, and so drops its load: a packet too short for it is not refused by it).
                while let Some((jt, jf)) = code[to as usize].targets() {
                    if jt != jf || matches!(code[to as usize], Insn::Touch { .. }) {
                        break;
                    }
                    to = jt;
                }
                if to != succ {
                    code[n as usize].set_target(which, to);
                    changed = true;
                }
            }
        }
        if !changed {
            return entry;
        }
    }
    entry
}

/// A filter compiled for one link type: decides whether a packet matches.
#[derive(Clone, Debug)]
pub struct Matcher {
    code: Vec<Insn>,
    entry: u32,
    cond: Cond,
    /// The reachable code lowered for execution: compact, laid out in execution order.
    ops: Ops,
    /// Values of `Gen`/`GenX`/`Touch` operations, indexed by `Op::aux`.
    vals: Vec<Val>,
    /// Constants of `AIn` operations: `Op::k` of them from `Op::off`.
    sets: Vec<u32>,
}

/// What an [`Op`] does: where its value comes from and how it is tested, in one dispatch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Code {
    Ret,
    AbsBEq,
    AbsBGt,
    AbsBGe,
    AbsBSet,
    AbsHEq,
    AbsHGt,
    AbsHGe,
    AbsHSet,
    AbsWEq,
    AbsWGt,
    AbsWGe,
    AbsWSet,
    TranBEq,
    TranBGt,
    TranBGe,
    TranBSet,
    TranHEq,
    TranHGt,
    TranHGe,
    TranHSet,
    TranWEq,
    TranWGt,
    TranWGe,
    TranWSet,
    LenEq,
    LenGt,
    LenGe,
    LenSet,
    /// Computes `vals[aux]` (ends the program if a load fails), then goes to `jt`.
    Touch,
    /// The value the previous operation loaded (every way here loads the same field), tested again.
    AEq,
    /// `A & mask` is one of `sets[off..off + k]`.
    AIn,
    AGt,
    AGe,
    ASet,
    Gen,
    GenX,
    After,
    Before,
}

fn code_of(kind: usize, test: Test) -> Code {
    const CODES: [[Code; 4]; 7] = [
        [Code::AbsBEq, Code::AbsBGt, Code::AbsBGe, Code::AbsBSet],
        [Code::AbsHEq, Code::AbsHGt, Code::AbsHGe, Code::AbsHSet],
        [Code::AbsWEq, Code::AbsWGt, Code::AbsWGe, Code::AbsWSet],
        [Code::TranBEq, Code::TranBGt, Code::TranBGe, Code::TranBSet],
        [Code::TranHEq, Code::TranHGt, Code::TranHGe, Code::TranHSet],
        [Code::TranWEq, Code::TranWGt, Code::TranWGe, Code::TranWSet],
        [Code::LenEq, Code::LenGt, Code::LenGe, Code::LenSet],
    ];
    let t = match test {
        Test::Eq => 0,
        Test::Gt => 1,
        Test::Ge => 2,
        Test::Set => 3,
    };
    CODES[kind][t]
}

#[inline(always)]
fn abs1(data: &[u8], off: u32) -> Option<u32> {
    data.get(off as usize).map(|&b| u32::from(b))
}

#[inline(always)]
fn abs2(data: &[u8], off: u32) -> Option<u32> {
    match data.get(off as usize..off as usize + 2) {
        Some(&[a, b]) => Some(u32::from(u16::from_be_bytes([a, b]))),
        _ => None,
    }
}

#[inline(always)]
fn abs4(data: &[u8], off: u32) -> Option<u32> {
    match data.get(off as usize..off as usize + 4) {
        Some(&[a, b, c, d]) => Some(u32::from_be_bytes([a, b, c, d])),
        _ => None,
    }
}

#[inline(always)]
fn hdr(data: &[u8], msh: u32, off: u32) -> Option<u32> {
    data.get(msh as usize).map(|&b| off + 4 * u32::from(b & 0xf))
}

#[inline(always)]
fn tran1(data: &[u8], msh: u32, off: u32) -> Option<u32> {
    abs1(data, hdr(data, msh, off)?)
}

#[inline(always)]
fn tran2(data: &[u8], msh: u32, off: u32) -> Option<u32> {
    abs2(data, hdr(data, msh, off)?)
}

#[inline(always)]
fn tran4(data: &[u8], msh: u32, off: u32) -> Option<u32> {
    abs4(data, hdr(data, msh, off)?)
}

/// One executable operation: load (by `kind`), mask, test against `k`, jump. 24 bytes.
#[derive(Clone, Copy, Debug)]
struct Op<J> {
    code: Code,
    test: Test,
    off: u32,
    mask: u32,
    k: u32,
    /// `Tran`: offset of the IPv4 header; `Gen`: index of the value; `GenX`: index of the left value; times:
    /// low 32 bits of the instant.
    aux: u32,
    /// Where to go when the test holds: 16 bits in all but huge programs. A `jt` of another width than `jf`
    /// keeps the compiler from choosing the next operation with a load indexed by the test's result (which would
    /// make it wait for the packet byte); it branches instead (docs/BENCHMARKS.md).
    jt: J,
    jf: u32,
}

/// The width of `Op::jt`.
trait Jump: Copy + PartialEq + std::fmt::Debug {
    fn of(at: u32) -> Self;
    fn at(self) -> usize;
}

impl Jump for u16 {
    fn of(at: u32) -> u16 {
        at as u16
    }
    #[inline(always)]
    fn at(self) -> usize {
        usize::from(self)
    }
}

impl Jump for u32 {
    fn of(at: u32) -> u32 {
        at
    }
    #[inline(always)]
    fn at(self) -> usize {
        self as usize
    }
}

/// A lowered program: 16-bit true-jumps when it has at most 65,535 operations, else 32-bit.
#[derive(Clone, Debug)]
enum Ops {
    Short(Vec<Op<u16>>),
    Wide(Vec<Op<u32>>),
}

/// The lowered program: operations, the values of `Gen`/`GenX`/`Touch`, and the constants of `AIn` sets.
type Lowered<J> = (Vec<Op<J>>, Vec<Val>, Vec<u32>);

/// Lowers the reachable code to [`Op`]s in execution order.
fn lower<J: Jump>(code: &[Insn], order: &[u32]) -> Lowered<J> {
    let mut at = vec![u32::MAX; code.len()];
    for (i, &n) in order.iter().enumerate() {
        at[n as usize] = i as u32;
    }
    let jfw = |x: u32| at[x as usize];
    let mut vals = Vec::new();
    let mut sets = Vec::new();
    let mut ops = Vec::with_capacity(order.len());
    for &n in order {
        let j = |x: u32| J::of(at[x as usize]);
        let op = match &code[n as usize] {
            Insn::Ret(r) => {
                Op { code: Code::Ret, test: Test::Eq, off: 0, mask: 0, k: u32::from(*r), aux: 0, jt: J::of(0), jf: 0 }
            }
            Insn::Abs { off, size, mask, test, k, jt, jf, .. } => {
                let kind = usize::from(*size).min(4) / 2; // 1, 2, 4 bytes: 0, 1, 2
                Op {
                    code: code_of(kind, *test),
                    test: *test,
                    off: *off,
                    mask: *mask,
                    k: *k,
                    aux: 0,
                    jt: j(*jt),
                    jf: jfw(*jf),
                }
            }
            Insn::Tran { msh, off, size, mask, test, k, jt, jf, .. } => {
                let kind = 3 + usize::from(*size).min(4) / 2;
                Op {
                    code: code_of(kind, *test),
                    test: *test,
                    off: *off,
                    mask: *mask,
                    k: *k,
                    aux: *msh,
                    jt: j(*jt),
                    jf: jfw(*jf),
                }
            }
            Insn::Len { mask, test, k, jt, jf } => Op {
                code: code_of(6, *test),
                test: *test,
                off: 0,
                mask: *mask,
                k: *k,
                aux: 0,
                jt: j(*jt),
                jf: jfw(*jf),
            },
            Insn::Gen { v, test, k, jt, jf } => {
                vals.push(v.clone());
                let aux = (vals.len() - 1) as u32;
                Op { code: Code::Gen, test: *test, off: 0, mask: u32::MAX, k: *k, aux, jt: j(*jt), jf: jfw(*jf) }
            }
            Insn::GenX { a, test, b, jt, jf } => {
                vals.push(a.clone());
                vals.push(b.clone());
                let aux = (vals.len() - 2) as u32;
                Op { code: Code::GenX, test: *test, off: 0, mask: u32::MAX, k: 0, aux, jt: j(*jt), jf: jfw(*jf) }
            }
            Insn::Touch { v, next } => {
                vals.push(v.clone());
                let aux = (vals.len() - 1) as u32;
                Op { code: Code::Touch, test: Test::Eq, off: 0, mask: 0, k: 0, aux, jt: j(*next), jf: jfw(*next) }
            }
            Insn::Time { after, t, jt, jf } => Op {
                code: if *after { Code::After } else { Code::Before },
                test: Test::Eq,
                off: (*t >> 32) as u32,
                mask: 0,
                k: 0,
                aux: *t as u32,
                jt: j(*jt),
                jf: jfw(*jf),
            },
        };
        ops.push(op);
    }
    // An operation whose every predecessor loaded the same field finds it in A.
    let load_key = |op: &Op<J>| -> Option<(u8, u32, u32)> {
        let class = match op.code {
            Code::AbsBEq | Code::AbsBGt | Code::AbsBGe | Code::AbsBSet => 0,
            Code::AbsHEq | Code::AbsHGt | Code::AbsHGe | Code::AbsHSet => 1,
            Code::AbsWEq | Code::AbsWGt | Code::AbsWGe | Code::AbsWSet => 2,
            Code::TranBEq | Code::TranBGt | Code::TranBGe | Code::TranBSet => 3,
            Code::TranHEq | Code::TranHGt | Code::TranHGe | Code::TranHSet => 4,
            Code::TranWEq | Code::TranWGt | Code::TranWGe | Code::TranWSet => 5,
            Code::LenEq | Code::LenGt | Code::LenGe | Code::LenSet => 6,
            _ => return None,
        };
        Some((class, op.off, op.aux))
    };
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    for (i, op) in ops.iter().enumerate() {
        if op.code != Code::Ret {
            preds[op.jt.at()].push(i);
            preds[op.jf as usize].push(i);
        }
    }
    // Keys of the original loads (an `A` operation carries its predecessors' key forward).
    let mut key: Vec<Option<(u8, u32, u32)>> = ops.iter().map(load_key).collect();
    for i in 0..ops.len() {
        let Some(k) = key[i] else { continue };
        if !preds[i].is_empty() && preds[i].iter().all(|&p| key[p] == Some(k)) {
            ops[i].code = match ops[i].test {
                Test::Eq => Code::AEq,
                Test::Gt => Code::AGt,
                Test::Ge => Code::AGe,
                Test::Set => Code::ASet,
            };
        }
        key[i] = Some(k);
    }
    // A run of `A == k` tests chained by their false branches towards one true target (port and address lists)
    // becomes one membership test: one branch instead of one per value.
    for i in 0..ops.len() {
        if ops[i].code != Code::AEq {
            continue;
        }
        let (jt, mask) = (ops[i].jt, ops[i].mask);
        let mut set = vec![ops[i].k];
        let mut cur = i;
        loop {
            let nx = ops[cur].jf as usize;
            let chained = ops.get(nx).is_some_and(|o| o.code == Code::AEq && o.jt == jt && o.mask == mask);
            if !chained || preds[nx] != [cur] || set.len() >= 64 {
                break;
            }
            set.push(ops[nx].k);
            cur = nx;
        }
        if set.len() >= 2 {
            let at = sets.len() as u32;
            sets.extend_from_slice(&set);
            ops[i] =
                Op { code: Code::AIn, test: Test::Eq, off: at, mask, k: set.len() as u32, aux: 0, jt, jf: ops[cur].jf };
        }
    }
    (ops, vals, sets)
}

/// `(value & mask)` recognised as a fused load.
fn fused(v: &Val) -> Option<(&Val, u32)> {
    match v {
        Val::Alu(Alu::And, a, b) => match **b {
            Val::K(mask) => Some((a, mask)),
            _ => None,
        },
        _ => Some((v, u32::MAX)),
    }
}

impl Matcher {
    /// Compiles a condition tree.
    pub fn new(cond: Cond) -> Matcher {
        let mut code = vec![Insn::Ret(true), Insn::Ret(false)];
        let entry = emit(&mut code, &cond, ACCEPT, REJECT);
        let mut entry = thread_jumps(&mut code, entry);
        // libpcap alternates jump threading and pullups until neither changes anything.
        for _ in 0..256 {
            if !pullups(&mut code, entry) {
                break;
            }
            entry = thread_jumps(&mut code, entry);
        }
        // libpcap folds comparisons of computed constants only in its last phase, after branches stop moving:
        // such a test stays where it is. Then `opt_root` skips a first test that decides nothing, keeping its
        // load unless what follows is a return.
        let decided = |i: &Insn| match *i {
            Insn::Gen { v: Val::K(a), test, k, jt, jf } => Some(if test.apply(a, k) { jt } else { jf }),
            Insn::GenX { a: Val::K(a), test, b: Val::K(b), jt, jf } => Some(if test.apply(a, b) { jt } else { jf }),
            Insn::Touch { .. } => None,
            ref i => match i.targets() {
                Some((jt, jf)) if jt == jf => Some(jt),
                _ => None,
            },
        };
        // The computation of variable offsets is part of the first block in libpcap: look past it, and keep it
        // unless the program becomes a return.
        let touch = match code[entry as usize] {
            Insn::Touch { next, .. } => Some((entry, next)),
            _ => None,
        };
        let mut root = touch.map_or(entry, |t| t.1);
        if let Some(mut next) = decided(&code[root as usize]) {
            while let Some(n) = decided(&code[next as usize]) {
                next = n;
            }
            let keeps_load = !matches!(
                code[root as usize],
                Insn::Gen { v: Val::K(_), .. } | Insn::GenX { a: Val::K(_), b: Val::K(_), .. }
            );
            if matches!(code[next as usize], Insn::Ret(_)) || !keeps_load {
                root = next;
            } else {
                code[root as usize].set_target(true, next);
                code[root as usize].set_target(false, next);
            }
        }
        entry = match touch {
            Some((t, _)) if !matches!(code[root as usize], Insn::Ret(_)) => {
                code[t as usize].set_target(true, root);
                t
            }
            _ => root,
        };
        let order = reachable(&code, entry);
        let (ops, vals, sets) = if order.len() <= usize::from(u16::MAX) {
            let (o, v, s) = lower::<u16>(&code, &order);
            (Ops::Short(o), v, s)
        } else {
            let (o, v, s) = lower::<u32>(&code, &order);
            (Ops::Wide(o), v, s)
        };
        Matcher { code, entry, cond, ops, vals, sets }
    }

    /// The condition tree this matcher runs (what `--explain` prints).
    pub fn cond(&self) -> &Cond {
        &self.cond
    }

    /// The reachable program, one instruction per line in execution order (what `--explain` shows).
    pub fn listing(&self) -> String {
        use std::fmt::Write as _;
        let order = reachable(&self.code, self.entry);
        let pos = |n: u32| order.iter().position(|&m| m == n).unwrap_or(usize::MAX);
        let mut out = String::new();
        for (i, &n) in order.iter().enumerate() {
            let t = |test: Test, k: u32| match test {
                Test::Eq => format!("== {k:#x}"),
                Test::Gt => format!("> {k:#x}"),
                Test::Ge => format!(">= {k:#x}"),
                Test::Set => format!("& {k:#x} != 0"),
            };
            let m = |mask: u32| if mask == u32::MAX { String::new() } else { format!(" & {mask:#x}") };
            let line = match &self.code[n as usize] {
                Insn::Ret(r) => format!("return {}", if *r { "match" } else { "no match" }),
                Insn::Abs { off, size, mask, test, k, jt, jf, .. } => {
                    format!("pkt[{off}:{size}]{} {}  then {} else {}", m(*mask), t(*test, *k), pos(*jt), pos(*jf))
                }
                Insn::Tran { msh, off, size, mask, test, k, jt, jf, .. } => format!(
                    "pkt[4*(pkt[{msh}]&0xf)+{off}:{size}]{} {}  then {} else {}",
                    m(*mask),
                    t(*test, *k),
                    pos(*jt),
                    pos(*jf)
                ),
                Insn::Len { mask, test, k, jt, jf } => {
                    format!("len{} {}  then {} else {}", m(*mask), t(*test, *k), pos(*jt), pos(*jf))
                }
                Insn::Gen { v, test, k, jt, jf } => {
                    format!("{v} {}  then {} else {}", t(*test, *k), pos(*jt), pos(*jf))
                }
                Insn::GenX { a, test, b, jt, jf } => format!("{a} {test:?} {b}  then {} else {}", pos(*jt), pos(*jf)),
                Insn::Touch { v, next } => format!("compute {v}  then {}", pos(*next)),
                Insn::Time { after, t: ts, jt, jf } => {
                    format!("time {} {ts}  then {} else {}", if *after { ">=" } else { "<" }, pos(*jt), pos(*jf))
                }
            };
            let _ = writeln!(out, "({i:03}) {line}");
        }
        out
    }

    /// Number of operations the program runs from (reachable ones, returns included).
    pub fn len(&self) -> usize {
        match &self.ops {
            Ops::Short(o) => o.len(),
            Ops::Wide(o) => o.len(),
        }
    }

    /// Whether the program is a single return (it decides without looking at the packet).
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// Whether no packet can match: after jump threading, no path reaches "match" (what libpcap's optimiser
    /// proves before refusing a filter with "expression rejects all packets", for example `tcp and udp`).
    pub fn rejects_all(&self) -> bool {
        !reachable(&self.code, self.entry).contains(&ACCEPT)
    }

    /// Whether `data` (captured bytes of a packet of `wirelen` bytes on the wire, taken at `ts_ns`) matches.
    #[inline]
    pub fn matches(&self, data: &[u8], wirelen: u32, ts_ns: u64) -> bool {
        match &self.ops {
            Ops::Short(ops) => self.run(ops, data, wirelen, ts_ns),
            Ops::Wide(ops) => self.run(ops, data, wirelen, ts_ns),
        }
    }

    #[inline(always)]
    fn run<J: Jump>(&self, ops: &[Op<J>], data: &[u8], wirelen: u32, ts_ns: u64) -> bool {
        let mut pc = 0usize;
        // libpcap's A register: the last value loaded, which `A*` operations test again without a load.
        let mut a = 0u32;
        // Load (ending the program with "no match" when the load fails), keep the value in A, test it.
        macro_rules! test {
            ($load:expr, |$v:ident| $cond:expr) => {
                match $load {
                    Some($v) => {
                        a = $v;
                        $cond
                    }
                    None => return false,
                }
            };
        }
        loop {
            let Some(op) = ops.get(pc) else { return false };
            let hit = match op.code {
                Code::Ret => return op.k != 0,
                Code::AbsBEq => test!(abs1(data, op.off), |v| v & op.mask == op.k),
                Code::AbsBGt => test!(abs1(data, op.off), |v| v & op.mask > op.k),
                Code::AbsBGe => test!(abs1(data, op.off), |v| v & op.mask >= op.k),
                Code::AbsBSet => test!(abs1(data, op.off), |v| v & op.mask & op.k != 0),
                Code::AbsHEq => test!(abs2(data, op.off), |v| v & op.mask == op.k),
                Code::AbsHGt => test!(abs2(data, op.off), |v| v & op.mask > op.k),
                Code::AbsHGe => test!(abs2(data, op.off), |v| v & op.mask >= op.k),
                Code::AbsHSet => test!(abs2(data, op.off), |v| v & op.mask & op.k != 0),
                Code::AbsWEq => test!(abs4(data, op.off), |v| v & op.mask == op.k),
                Code::AbsWGt => test!(abs4(data, op.off), |v| v & op.mask > op.k),
                Code::AbsWGe => test!(abs4(data, op.off), |v| v & op.mask >= op.k),
                Code::AbsWSet => test!(abs4(data, op.off), |v| v & op.mask & op.k != 0),
                Code::TranBEq => test!(tran1(data, op.aux, op.off), |v| v & op.mask == op.k),
                Code::TranBGt => test!(tran1(data, op.aux, op.off), |v| v & op.mask > op.k),
                Code::TranBGe => test!(tran1(data, op.aux, op.off), |v| v & op.mask >= op.k),
                Code::TranBSet => test!(tran1(data, op.aux, op.off), |v| v & op.mask & op.k != 0),
                Code::TranHEq => test!(tran2(data, op.aux, op.off), |v| v & op.mask == op.k),
                Code::TranHGt => test!(tran2(data, op.aux, op.off), |v| v & op.mask > op.k),
                Code::TranHGe => test!(tran2(data, op.aux, op.off), |v| v & op.mask >= op.k),
                Code::TranHSet => test!(tran2(data, op.aux, op.off), |v| v & op.mask & op.k != 0),
                Code::TranWEq => test!(tran4(data, op.aux, op.off), |v| v & op.mask == op.k),
                Code::TranWGt => test!(tran4(data, op.aux, op.off), |v| v & op.mask > op.k),
                Code::TranWGe => test!(tran4(data, op.aux, op.off), |v| v & op.mask >= op.k),
                Code::TranWSet => test!(tran4(data, op.aux, op.off), |v| v & op.mask & op.k != 0),
                Code::LenEq => test!(Some(wirelen), |v| v & op.mask == op.k),
                Code::LenGt => test!(Some(wirelen), |v| v & op.mask > op.k),
                Code::LenGe => test!(Some(wirelen), |v| v & op.mask >= op.k),
                Code::LenSet => test!(Some(wirelen), |v| v & op.mask & op.k != 0),
                Code::Touch => {
                    let p = Packet { data, wirelen, ts_ns };
                    if self.vals.get(op.aux as usize).and_then(|v| v.eval(&p)).is_none() {
                        return false;
                    }
                    true
                }
                Code::AEq => a & op.mask == op.k,
                Code::AIn => {
                    let v = a & op.mask;
                    let set = self.sets.get(op.off as usize..(op.off + op.k) as usize).unwrap_or(&[]);
                    set.iter().fold(false, |hit, &x| hit | (x == v))
                }
                Code::AGt => a & op.mask > op.k,
                Code::AGe => a & op.mask >= op.k,
                Code::ASet => a & op.mask & op.k != 0,
                Code::Gen => {
                    let p = Packet { data, wirelen, ts_ns };
                    match self.vals.get(op.aux as usize).and_then(|v| v.eval(&p)) {
                        Some(v) => op.test.apply(v, op.k),
                        None => return false,
                    }
                }
                Code::GenX => {
                    let p = Packet { data, wirelen, ts_ns };
                    let a = self.vals.get(op.aux as usize).and_then(|v| v.eval(&p));
                    let b = self.vals.get(op.aux as usize + 1).and_then(|v| v.eval(&p));
                    let (Some(a), Some(b)) = (a, b) else { return false };
                    op.test.apply(a, b)
                }
                Code::After | Code::Before => {
                    let t = (u64::from(op.off) << 32) | u64::from(op.aux);
                    (ts_ns >= t) == (op.code == Code::After)
                }
            };
            if hit {
                pc = op.jt.at();
                continue;
            }
            pc = op.jf as usize;
        }
    }
}

/// Emits code for `c` that continues at `jt` when it holds and `jf` when not; returns its entry.
fn emit(code: &mut Vec<Insn>, c: &Cond, jt: u32, jf: u32) -> u32 {
    let mut push = |i: Insn| {
        code.push(i);
        (code.len() - 1) as u32
    };
    match c {
        Cond::True => jt,
        Cond::False => jf,
        Cond::And(a, b) => {
            let eb = emit(code, b, jt, jf);
            emit(code, a, eb, jf)
        }
        Cond::Or(a, b) => {
            let eb = emit(code, b, jt, jf);
            emit(code, a, jt, eb)
        }
        Cond::Not(a) => emit(code, a, jf, jt),
        Cond::Time { after, t } => push(Insn::Time { after: *after, t: *t, jt, jf }),
        // Only ever first, under an `and`: what follows runs whether it holds or not.
        Cond::Touch(v) => push(Insn::Touch { v: v.clone(), next: jt }),
        Cond::CmpX { a, test, b } => {
            // A comparison of two values where the right one is a constant is a plain test.
            match b {
                Val::K(k) if !matches!(a, Val::K(_)) => emit_cmp(code, a, *test, *k, jt, jf, true),
                _ => push(Insn::GenX { a: a.clone(), test: *test, b: b.clone(), jt, jf }),
            }
        }
        Cond::Cmp { v, test, k } => emit_cmp(code, v, *test, *k, jt, jf, false),
    }
}

/// A test of a value against a constant, fused with its load where the value is one. `rel`: the test comes from a
/// relation (`proto[...] relop expr`), which libpcap's optimiser relates to other relations on the same field but
/// not to the tests primitives make, so jump threading keeps them apart.
fn emit_cmp(code: &mut Vec<Insn>, v: &Val, test: Test, k: u32, jt: u32, jf: u32, rel: bool) -> u32 {
    let (mut test, mut k, mut jt, mut jf) = (test, k, jt, jf);
    let mut v = v;
    // libpcap's peephole: `x & m == 0` becomes "not (x has a bit of m set)", a test of x itself. A relation's
    // mask is an `and x` that becomes `and #m` only after branches stop moving, so relations keep their form.
    if let (Test::Eq, 0, Val::Alu(Alu::And, x, m), false) = (test, k, v, rel)
        && let Val::K(m) = **m
        && matches!(**x, Val::Ld { .. } | Val::LdInd { .. } | Val::Len)
    {
        v = x;
        test = Test::Set;
        k = m;
        std::mem::swap(&mut jt, &mut jf);
    }
    let insn = match fused(v) {
        Some((Val::Ld { off, size }, mask)) => {
            Insn::Abs { off: *off, size: *size, mask, test, k, jt, jf, rel, split: 0 }
        }
        // A constant index: libpcap's optimiser folds `ld [x + k]` with a known X into an absolute load whose
        // offset is computed in 32 bits, so the sum wraps as it does there.
        Some((Val::LdInd { base, off, size }, mask)) if let Val::K(i) = **base => {
            Insn::Abs { off: off.wrapping_add(i), size: *size, mask, test, k, jt, jf, rel, split: i }
        }
        Some((Val::LdInd { base, off, size }, mask)) if let Val::Msh(msh) = **base => {
            Insn::Tran { msh, off: *off, size: *size, mask, test, k, jt, jf, rel }
        }
        Some((Val::Len, mask)) => Insn::Len { mask, test, k, jt, jf },
        _ => Insn::Gen { v: v.clone(), test, k, jt, jf },
    };
    code.push(insn);
    (code.len() - 1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Filter, Target};
    use pcaptool_packet::LinkType;

    /// Programs of more than 65,535 operations run with 32-bit jumps through the same interpreter: lowering a
    /// small program both ways decides every packet alike.
    #[test]
    fn wide_jumps_decide_as_short_ones() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for f in
            ["tcp port 80 or 443 or 22", "host 10.0.0.1 and not udp", "vlan and ip and tcp[13] & 2 != 0", "len > 60"]
        {
            let m = Filter::new(f).unwrap().compile(Target::new(LinkType::ETHERNET)).unwrap();
            let order = reachable(&m.code, m.entry);
            let (wide, _, _) = lower::<u32>(&m.code, &order);
            assert!(matches!(m.ops, Ops::Short(_)));
            for _ in 0..2000 {
                let mut pkt = vec![0u8; (next() % 90) as usize];
                pkt.iter_mut().for_each(|b| *b = next() as u8);
                if pkt.len() > 14 && next() % 2 == 0 {
                    pkt[12..14].copy_from_slice(if next() % 2 == 0 { &[8, 0] } else { &[0x86, 0xdd] });
                }
                let wire = pkt.len() as u32 + (next() % 8) as u32;
                assert_eq!(m.run(&wide, &pkt, wire, 0), m.matches(&pkt, wire, 0), "`{f}` on {pkt:02x?}");
            }
        }
    }
}
