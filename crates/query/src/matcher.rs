//! The compiled matcher: a [`Cond`] flattened into jump code with fused load-and-test instructions.
//!
//! Each test instruction loads (from a fixed offset, or after a variable IPv4 header), masks, compares and jumps
//! to one of two instructions; `and`, `or` and `not` become jump targets and cost nothing at run time. The first
//! two instructions are "match" and "no match". A load past the captured bytes jumps to "no match", as in BPF.

use crate::prog::{Alu, Cond, Packet, Test, Val, load};

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
    Abs(u32, u8, u32),
    Tran(u32, u32, u8, u32),
    Len(u32),
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
            Insn::Abs { off, size, mask, test, k, .. } => Some((Key::Abs(off, size, mask), test, k)),
            Insn::Tran { msh, off, size, mask, test, k, .. } => Some((Key::Tran(msh, off, size, mask), test, k)),
            Insn::Len { mask, test, k, .. } => Some((Key::Len(mask), test, k)),
            _ => None,
        }
    }

    fn targets(&self) -> Option<(u32, u32)> {
        match *self {
            Insn::Ret(_) => None,
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

/// Jump threading, as libpcap's optimiser does it: an edge whose target's test is decided by what is known on
/// every path to the edge (the same test made before, or an equality with another constant that held) is
/// redirected past that target. Only tests of a value already loaded on the way are skipped, so no load that
/// could fail is removed and the result is unchanged for every packet.
fn thread_jumps(code: &mut [Insn], entry: u32) {
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
                if to != succ {
                    code[n as usize].set_target(which, to);
                    changed = true;
                }
            }
        }
        if !changed {
            return;
        }
    }
}

/// A filter compiled for one link type: decides whether a packet matches.
#[derive(Clone, Debug)]
pub struct Matcher {
    code: Vec<Insn>,
    entry: u32,
    cond: Cond,
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
        thread_jumps(&mut code, entry);
        Matcher { code, entry, cond }
    }

    /// The condition tree this matcher runs (what `--explain` prints).
    pub fn cond(&self) -> &Cond {
        &self.cond
    }

    /// Number of instructions (for benchmarks and explanations).
    pub fn len(&self) -> usize {
        self.code.len()
    }

    /// Whether the program is only the two return instructions.
    pub fn is_empty(&self) -> bool {
        self.code.len() <= 2
    }

    /// Whether no packet can match: after jump threading, no path reaches "match" (what libpcap's optimiser
    /// proves before refusing a filter with "expression rejects all packets", for example `tcp and udp`).
    pub fn rejects_all(&self) -> bool {
        !reachable(&self.code, self.entry).contains(&ACCEPT)
    }

    /// Whether `data` (captured bytes of a packet of `wirelen` bytes on the wire, taken at `ts_ns`) matches.
    #[inline]
    pub fn matches(&self, data: &[u8], wirelen: u32, ts_ns: u64) -> bool {
        let mut pc = self.entry as usize;
        loop {
            // The code is built so that every jump target is in range; a failed lookup would be a compiler bug
            // and counts as no match.
            let Some(insn) = self.code.get(pc) else { return false };
            pc = match *insn {
                Insn::Ret(r) => return r,
                Insn::Abs { off, size, mask, test, k, jt, jf } => {
                    let Some(v) = load(data, u64::from(off), size) else { return false };
                    if test.apply(v & mask, k) { jt } else { jf }
                }
                Insn::Tran { msh, off, size, mask, test, k, jt, jf } => {
                    let Some(&b) = data.get(msh as usize) else { return false };
                    let x = u64::from(4 * (b & 0xf));
                    let Some(v) = load(data, x + u64::from(off), size) else { return false };
                    if test.apply(v & mask, k) { jt } else { jf }
                }
                Insn::Len { mask, test, k, jt, jf } => {
                    if test.apply(wirelen & mask, k) {
                        jt
                    } else {
                        jf
                    }
                }
                Insn::Gen { ref v, test, k, jt, jf } => {
                    let p = Packet { data, wirelen, ts_ns };
                    let Some(v) = v.eval(&p) else { return false };
                    if test.apply(v, k) { jt } else { jf }
                }
                Insn::GenX { ref a, test, ref b, jt, jf } => {
                    let p = Packet { data, wirelen, ts_ns };
                    let (Some(a), Some(b)) = (a.eval(&p), b.eval(&p)) else { return false };
                    if test.apply(a, b) { jt } else { jf }
                }
                Insn::Time { after, t, jt, jf } => {
                    if (ts_ns >= t) == after {
                        jt
                    } else {
                        jf
                    }
                }
            } as usize;
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
        Cond::CmpX { a, test, b } => {
            // A comparison of two values where the right one is a constant is a plain test.
            match b {
                Val::K(k) => emit(code, &Cond::Cmp { v: a.clone(), test: *test, k: *k }, jt, jf),
                _ => push(Insn::GenX { a: a.clone(), test: *test, b: b.clone(), jt, jf }),
            }
        }
        Cond::Cmp { v: Val::K(a), test, k } => {
            if test.apply(*a, *k) {
                jt
            } else {
                jf
            }
        }
        Cond::Cmp { v, test, k } => {
            let (test, k) = (*test, *k);
            match fused(v) {
                Some((Val::Ld { off, size }, mask)) => {
                    push(Insn::Abs { off: *off, size: *size, mask, test, k, jt, jf })
                }
                Some((Val::LdInd { base, off, size }, mask)) if let Val::Msh(msh) = **base => {
                    push(Insn::Tran { msh, off: *off, size: *size, mask, test, k, jt, jf })
                }
                Some((Val::Len, mask)) => push(Insn::Len { mask, test, k, jt, jf }),
                _ => push(Insn::Gen { v: v.clone(), test, k, jt, jf }),
            }
        }
    }
}
