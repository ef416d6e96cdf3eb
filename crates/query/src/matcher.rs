//! The compiled matcher: a [`Cond`] flattened into jump code with fused load-and-test instructions.
//!
//! Each test instruction loads (from a fixed offset, or after a variable IPv4 header), masks, compares and jumps
//! to one of two instructions; `and`, `or` and `not` become jump targets and cost nothing at run time. The first
//! two instructions are "match" and "no match". A load past the captured bytes jumps to "no match", as in BPF.

use crate::prog::{Alu, Cond, Packet, Test, Val};

/// Instructions past which a program is optimised by jump threading alone (see [`Matcher::new`]): about 44
/// `port` terms, 100 `tcp port` terms.
pub const LARGE_PROGRAM: usize = 1024;

/// Facts followed into an instruction of a program longer than [`LARGE_PROGRAM`].
const FACTS_CAP: usize = 16;

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
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
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

/// Whether a value loads at an offset that depends on a header of variable length (802.11 after radiotap, PPI;
/// the packet inside a Geneve header).
fn variable(v: &Val) -> bool {
    v.any(&|x| matches!(x, Val::Wlan { .. } | Val::PrefixLen | Val::Geneve { .. }))
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
    /// The tests it can decide (see `thread_jumps`): a function of the rest.
    group: u32,
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

/// Instructions reachable from `entry`, in topological order (the code is acyclic): the reverse of the order
/// in which a depth-first walk taking the true branch first finishes them. Iterative, so that programs of any
/// length are walked without deep recursion.
fn reachable(code: &[Insn], entry: u32) -> Vec<u32> {
    let mut seen = vec![false; code.len()];
    let mut out = Vec::new();
    // (instruction, whether its branches have been walked).
    let mut stack = vec![(entry, false)];
    while let Some((n, done)) = stack.pop() {
        if done {
            out.push(n);
            continue;
        }
        if std::mem::replace(&mut seen[n as usize], true) {
            continue;
        }
        stack.push((n, true));
        if let Some((jt, jf)) = code[n as usize].targets() {
            stack.push((jf, false));
            stack.push((jt, false));
        }
    }
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

/// The dominator tree of the reachable code, answering "does `b` dominate `n`" in constant time.
struct Dominators {
    /// Each reachable instruction's interval in a depth-first walk of the tree (`u32::MAX`: unreachable).
    enter: Vec<u32>,
    exit: Vec<u32>,
}

impl Dominators {
    /// Immediate dominators by intersecting the predecessors' (Cooper, Harvey and Kennedy; one pass, since the
    /// code is acyclic and `order` topological), then the tree's intervals.
    fn new(code: &[Insn], order: &[u32], preds: &[Vec<(u32, bool)>]) -> Dominators {
        let mut rank = vec![u32::MAX; code.len()];
        for (i, &n) in order.iter().enumerate() {
            rank[n as usize] = i as u32;
        }
        let mut idom = vec![u32::MAX; code.len()];
        if let Some(&entry) = order.first() {
            idom[entry as usize] = entry;
        }
        for &n in order.iter().skip(1) {
            let mut d: Option<u32> = None;
            for &(p, _) in &preds[n as usize] {
                if idom[p as usize] == u32::MAX {
                    continue;
                }
                d = Some(match d {
                    None => p,
                    Some(mut a) => {
                        let mut b = p;
                        while a != b {
                            while rank[a as usize] > rank[b as usize] {
                                a = idom[a as usize];
                            }
                            while rank[b as usize] > rank[a as usize] {
                                b = idom[b as usize];
                            }
                        }
                        a
                    }
                });
            }
            idom[n as usize] = d.unwrap_or(n);
        }
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); code.len()];
        for &n in order.iter().skip(1) {
            children[idom[n as usize] as usize].push(n);
        }
        let (mut enter, mut exit) = (vec![u32::MAX; code.len()], vec![u32::MAX; code.len()]);
        let mut clock = 0u32;
        let mut stack: Vec<(u32, bool)> = order.first().map(|&e| (e, false)).into_iter().collect();
        while let Some((n, done)) = stack.pop() {
            if done {
                exit[n as usize] = clock;
                clock += 1;
                continue;
            }
            enter[n as usize] = clock;
            clock += 1;
            stack.push((n, true));
            stack.extend(children[n as usize].iter().map(|&c| (c, false)));
        }
        Dominators { enter, exit }
    }

    /// Whether every way to `n` goes through `by` (`n` itself included; an unreachable `n` is dominated by
    /// everything).
    fn dominates(&self, by: u32, n: u32) -> bool {
        let (b, n) = (by as usize, n as usize);
        self.enter[n] == u32::MAX || (self.enter[b] <= self.enter[n] && self.exit[n] <= self.exit[b])
    }
}

/// libpcap's `or_pullup` (`along_false`) and `and_pullup`: in a chain of tests linked by their false (true)
/// branches that all share one true (false) target, a later test of the value the chain's predecessor tested is
/// moved up next to it, so that tests of one field run together. This changes which loads a short packet
/// reaches, as it does in libpcap. Returns whether the code changed.
fn pullup(code: &mut [Insn], preds: &[Vec<(u32, bool)>], dom: &Dominators, b: u32, along_false: bool) -> bool {
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
        if code[n as usize].targets().is_none() || shared(n) != common || !dom.dominates(b, n) {
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
        if code[n as usize].targets().is_none() || shared(n) != common || !dom.dominates(b, n) {
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
    let dom = Dominators::new(code, &order, &preds);
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
    thread_jumps_with(code, entry, None)
}

/// [`thread_jumps`], following at most `cap` facts into each instruction when given: those that can decide the
/// most tests. Knowing less only means deciding fewer tests ahead, never deciding one wrongly; it bounds the work
/// on long programs, where parallel chains (a `port` list's copies for TCP, UDP and SCTP) keep thousands of facts
/// alive at once. With a cap, a walk past decided tests stops after 64 and there are 3 rounds: the first two do
/// nearly all of it on long lists (10,000 `port` terms: 0.4 s in all).
fn thread_jumps_with(code: &mut [Insn], entry: u32, cap: Option<usize>) -> u32 {
    // A fact is followed only while a test it can decide may still come: a test of the same value, test and
    // constant (decided by a fact of either sense), or for an equality that held, any equality test of the same
    // value. Each such group of tests gets a number; a fact is dropped on an edge into an instruction after the
    // group's last test in topological order (none of them can be reached from there). This keeps the sets small
    // on long chains (thousands of `port` terms each add "not this port" facts that nothing later reads) and
    // changes no decision. Tests do not change below, so neither do the groups, nor the facts each test makes
    // (numbered once: the sets hold their numbers).
    let tests: Vec<Option<(Key, Test, u32)>> = code.iter().map(Insn::test).collect();
    let mut groups: std::collections::HashMap<(Key, Test, Option<u32>), u32> = std::collections::HashMap::new();
    // Per instruction: the groups its test belongs to (exact, and any-equality); per group, its tests.
    let mut member: Vec<[u32; 2]> = vec![[u32::MAX; 2]; code.len()];
    let mut size: Vec<u32> = Vec::new();
    for (n, t) in tests.iter().enumerate() {
        if let Some((key, test, k)) = *t {
            let mut join = |g: (Key, Test, Option<u32>)| {
                let next = groups.len() as u32;
                let at = *groups.entry(g).or_insert(next);
                if at == next {
                    size.push(0);
                }
                size[at as usize] += 1;
                at
            };
            member[n][0] = join((key, test, Some(k)));
            if test == Test::Eq {
                member[n][1] = join((key, test, None));
            }
        }
    }
    // The facts, numbered; per instruction, the number of the fact its false and its true branch make.
    let mut facts: Vec<Fact> = Vec::new();
    let mut numbered: std::collections::HashMap<(Key, Test, u32, bool), u32> = std::collections::HashMap::new();
    let mut made: Vec<[u32; 2]> = vec![[u32::MAX; 2]; code.len()];
    for (n, t) in tests.iter().enumerate() {
        let Some((key, test, k)) = *t else { continue };
        for sense in [false, true] {
            let group = if sense && test == Test::Eq { member[n][1] } else { member[n][0] };
            let id = *numbered.entry((key, test, k, sense)).or_insert_with(|| {
                facts.push(Fact { key, test, k, sense, group });
                (facts.len() - 1) as u32
            });
            made[n][usize::from(sense)] = id;
        }
    }
    let weight = |id: u32| size.get(facts[id as usize].group as usize).copied().unwrap_or(0);
    // libpcap's `fold_edge` on an instruction whose test is `t`: where fact `f` sends it, if it decides it.
    let fold_at = |t: Option<(Key, Test, u32)>, targets: Option<(u32, u32)>, f: &Fact| -> Option<u32> {
        let (key, test, k) = t?;
        let (jt, jf) = targets?;
        if key != f.key || test != f.test {
            return None;
        }
        if k == f.k {
            return Some(if f.sense { jt } else { jf });
        }
        (f.sense && test == Test::Eq).then_some(jf)
    };
    let rounds = if cap.is_some() { 3 } else { 64 };
    for _round in 0..rounds {
        let order = reachable(code, entry);
        let mut rank = vec![u32::MAX; code.len()];
        let mut last = vec![0u32; groups.len()];
        for (r, &n) in order.iter().enumerate() {
            rank[n as usize] = r as u32;
            for g in member[n as usize] {
                if let Some(l) = last.get_mut(g as usize) {
                    *l = r as u32;
                }
            }
        }
        // Whether fact `id` can still decide a test at or after instruction `at`.
        let live =
            |id: u32, at: u32| last.get(facts[id as usize].group as usize).is_some_and(|&l| l >= rank[at as usize]);
        let mut known: Vec<Option<Vec<u32>>> = vec![None; code.len()];
        known[entry as usize] = Some(Vec::new());
        // The facts on the edge from `n` along its `sense` branch into `to`, into `f`.
        let edge_facts = |f: &mut Vec<u32>, n: u32, sense: bool, to: u32, known: &[Option<Vec<u32>>]| {
            f.clear();
            let base = known[n as usize].as_deref().unwrap_or_default();
            f.extend(base.iter().copied().filter(|&x| live(x, to)));
            let id = made[n as usize][usize::from(sense)];
            if id != u32::MAX && live(id, to) && !f.contains(&id) {
                f.push(id);
            }
            if let Some(cap) = cap
                && f.len() > cap
            {
                f.sort_by_key(|&x| std::cmp::Reverse(weight(x)));
                f.truncate(cap);
            }
        };
        let mut f = Vec::new();
        for &n in &order {
            let Some((jt, jf)) = code[n as usize].targets() else { continue };
            for (sense, succ) in [(true, jt), (false, jf)] {
                edge_facts(&mut f, n, sense, succ, &known);
                match &mut known[succ as usize] {
                    slot @ None => *slot = Some(f.clone()),
                    Some(g) => g.retain(|x| f.contains(x)),
                }
            }
        }
        let mut changed = false;
        for &n in &order {
            let Some((jt, jf)) = code[n as usize].targets() else { continue };
            for (which, succ) in [(true, jt), (false, jf)] {
                edge_facts(&mut f, n, which, succ, &known);
                let mut to = succ;
                // With a cap, a walk past decided tests stops after a few (the next round goes on from there): a
                // long program would otherwise walk a long stretch from each of many edges.
                let most = if cap.is_some() { 64 } else { code.len() };
                let mut steps = 0;
                while let Some(next) = f
                    .iter()
                    .find_map(|&id| fold_at(tests[to as usize], code[to as usize].targets(), &facts[id as usize]))
                {
                    to = next;
                    steps += 1;
                    if steps > most {
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
    /// Whether the program is optimised as libpcap optimises it (see [`Matcher::unoptimized`]).
    optimized: bool,
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
        let large = code.len() > LARGE_PROGRAM;
        let mut entry = thread_jumps_with(&mut code, entry, large.then_some(FACTS_CAP));
        // libpcap alternates jump threading and pullups until neither changes anything. Each pullup is a pass over
        // the program and reshapes it, so that the facts jump threading follows then last long: on long programs
        // this costs time quadratic in their length or worse (libpcap's own optimiser takes 3 s on 300 `port` terms
        // and 73 s on 800). Longer programs than LARGE_PROGRAM are threaded only (docs/filters.md says what that
        // changes: only packets cut short between two fields they test).
        if !large {
            for _ in 0..256 {
                if !pullups(&mut code, entry) {
                    break;
                }
                entry = thread_jumps(&mut code, entry);
            }
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
        Matcher::finish(code, entry, cond, true)
    }

    /// The matcher of the program `code` from `entry`, lowered for execution.
    fn finish(code: Vec<Insn>, entry: u32, cond: Cond, optimized: bool) -> Matcher {
        let order = reachable(&code, entry);
        let (ops, vals, sets) = if order.len() <= usize::from(u16::MAX) {
            let (o, v, s) = lower::<u16>(&code, &order);
            (Ops::Short(o), v, s)
        } else {
            let (o, v, s) = lower::<u32>(&code, &order);
            (Ops::Wide(o), v, s)
        };
        Matcher { code, entry, cond, ops, vals, sets, optimized }
    }

    /// Whether the program is optimised as libpcap optimises it (libpcap does not optimise a filter holding
    /// `protochain` or `geneve`).
    pub fn optimized(&self) -> bool {
        self.optimized
    }

    /// Compiles a condition tree as libpcap runs a filter it does not optimise (one holding `protochain`): every
    /// test in the tree's order, no jump threaded past a test, no first test skipped.
    pub fn unoptimized(cond: Cond) -> Matcher {
        let mut code = vec![Insn::Ret(true), Insn::Ret(false)];
        let entry = emit(&mut code, &cond, ACCEPT, REJECT);
        Matcher::finish(code, entry, cond, false)
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
        // From the last operand back, each continuing at the one after it: the code `(a and b) and c` made as a
        // binary tree.
        Cond::And(v) => v.iter().rev().fold(jt, |next, c| emit(code, c, next, jf)),
        Cond::Or(v) => v.iter().rev().fold(jf, |next, c| emit(code, c, jt, next)),
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

    /// Programs longer than `LARGE_PROGRAM` (threaded with a cap, not pulled up) keep the matcher's contract with
    /// the tree: a packet the tree matches is matched; one the matcher matches and the tree does not is one on
    /// which the tree fails a load (a test the optimiser skipped). Long lists of ports, hosts and networks, mixed
    /// with other primitives, on random short and full-length packets.
    #[test]
    fn long_programs_decide_as_the_tree_where_every_load_succeeds() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let ports = (0..400).map(|i| format!("port {}", i * 7 % 1000)).collect::<Vec<_>>().join(" or ");
        let hosts = (0..300).map(|i| format!("host 10.0.{}.{}", i / 8, i % 8)).collect::<Vec<_>>().join(" or ");
        let mixed = (0..200)
            .map(|i| format!("(tcp dst port {i} and not src net 10.{i}.0.0/16) or udp[8] = {i}"))
            .collect::<Vec<_>>()
            .join(" or ");
        for f in [ports, hosts, mixed] {
            let filter = Filter::new(&f).unwrap();
            let m = filter.compile(Target::new(LinkType::ETHERNET)).unwrap();
            assert!(m.code.len() > LARGE_PROGRAM, "a long program: {} instructions", m.code.len());
            let (mut tree_yes, mut extra) = (0, 0);
            for _ in 0..20_000 {
                let mut pkt = vec![0u8; 14 + (next() % 70) as usize];
                pkt.iter_mut().for_each(|b| *b = (next() % 16) as u8);
                pkt[12..14].copy_from_slice(if next() % 2 == 0 { &[8, 0] } else { &[0x86, 0xdd] });
                if pkt.len() > 23 {
                    pkt[14] = 0x45;
                    pkt[20] = 0;
                    pkt[23] = [6u8, 17, 132][(next() % 3) as usize];
                    let addr = [10, 0, (next() % 40) as u8, (next() % 8) as u8];
                    let port = ((next() % 1000) as u16).to_be_bytes();
                    for (at, b) in [(26, &addr[..]), (30, &addr[..]), (34, &port[..]), (36, &port[..]), (54, &port[..])]
                    {
                        let (from, to) = (pkt.len().min(at), pkt.len().min(at + b.len()));
                        pkt[from..to].copy_from_slice(&b[..to - from]);
                    }
                }
                let wire = pkt.len() as u32;
                let p = Packet { data: &pkt, wirelen: wire, ts_ns: 0 };
                let tree = m.cond.eval(&p);
                let ours = m.matches(&pkt, wire, 0);
                match tree {
                    Some(true) => {
                        tree_yes += 1;
                        assert!(ours, "`{}...` misses a packet the tree matches: {pkt:02x?}", &f[..40]);
                    }
                    Some(false) => assert!(!ours, "`{}...` matches a packet the tree refuses: {pkt:02x?}", &f[..40]),
                    None => extra += usize::from(ours),
                }
            }
            assert!(tree_yes > 100, "`{}...`: the packets exercise it ({tree_yes} matches)", &f[..40]);
            let _ = extra;
        }
    }
}
