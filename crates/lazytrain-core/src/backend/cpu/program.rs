//! Lowering a fused group into the CPU's tile bytecode
//! ([`crate::kernels::fused`]): one instruction per member, loads where the
//! schedule says, stores for the group's outputs, then few physical
//! registers.

use crate::dtype::DType;
use crate::ir::{BinaryOp, Graph, Op};
use crate::kernels::fused::{FusedProgram, Gelu, Instr, LaneProgram, Src};
use crate::schedule::fusion::never_fused;
use crate::schedule::{Group, MemberRead};

/// A value inside a program under construction: a virtual register or a constant.
#[derive(Clone, Copy)]
enum Value {
    Reg(usize),
    Imm(f32),
}

/// Instructions under construction and their virtual registers.
#[derive(Default)]
struct ProgramBuilder {
    instrs: Vec<Instr>,
    registers: usize,
}

impl ProgramBuilder {
    /// Append the instruction `make(dst)` writing a fresh register; returns it.
    fn emit(&mut self, make: impl FnOnce(usize) -> Instr) -> usize {
        self.registers += 1;
        self.instrs.push(make(self.registers - 1));
        self.registers - 1
    }

    /// A register holding `v` (a constant is written into one as `v * 1`).
    fn register(&mut self, v: Value) -> usize {
        match v {
            Value::Reg(r) => r,
            Value::Imm(x) => {
                self.emit(|dst| Instr::Binary { op: BinaryOp::Mul, a: Src::Imm(x), b: Src::Imm(1.0), dst })
            }
        }
    }
}

/// Assemble the kernel of `group`; with `fast_paths`, a program the
/// kernels recognise (GELU's) runs by their loop for it, and a
/// straight-line one as a lane program (AdamW's by a loop of its own).
pub(super) fn build_program(graph: &Graph, group: &Group, fast_paths: bool) -> FusedProgram {
    let mut program = ProgramBuilder::default();
    let mut value_of: Vec<Option<Value>> = vec![None; graph.nodes.len()];
    for (&m, reads) in group.members.iter().zip(&group.reads) {
        let node = &graph.nodes[m];
        let mut operands = Vec::with_capacity(reads.len());
        let mut seed = None;
        for read in reads {
            match *read {
                MemberRead::Member(x) => operands.push(value_of[x].expect("members are built in order")),
                MemberRead::Immediate(v) => operands.push(Value::Imm(v)),
                MemberRead::Load(load) => operands.push(Value::Reg(program.emit(|dst| Instr::Load { load, dst }))),
                MemberRead::Seed(input) => seed = Some(input),
            }
        }
        let src = |v: Value| match v {
            Value::Reg(r) => Src::Reg(r),
            Value::Imm(x) => Src::Imm(x),
        };
        let rounded = |program: &mut ProgramBuilder, v: usize| match node.dtype {
            DType::BF16 => program.emit(|dst| Instr::RoundBf16 { src: v, dst }),
            _ => v,
        };
        let result = match &node.op {
            Op::Unary(op) => {
                let s = program.register(operands[0]);
                let v = program.emit(|dst| Instr::Unary { op: *op, src: s, dst });
                Value::Reg(rounded(&mut program, v))
            }
            Op::Binary(op) => {
                let (a, b) = (src(operands[0]), src(operands[1]));
                let v = program.emit(|dst| Instr::Binary { op: *op, a, b, dst });
                Value::Reg(rounded(&mut program, v))
            }
            Op::Compare(op) => {
                let (a, b) = (src(operands[0]), src(operands[1]));
                Value::Reg(program.emit(|dst| Instr::Compare { op: *op, a, b, dst }))
            }
            Op::Select => {
                let (c, a, b) = (src(operands[0]), src(operands[1]), src(operands[2]));
                Value::Reg(program.emit(|dst| Instr::Select { c, a, b, dst }))
            }
            Op::Cast if node.dtype == DType::Bool && graph.nodes[node.inputs[0].index()].dtype != DType::Bool => {
                let s = program.register(operands[0]);
                Value::Reg(program.emit(|dst| Instr::ToBool { src: s, dst }))
            }
            Op::Cast if node.dtype == DType::BF16 && graph.nodes[node.inputs[0].index()].dtype == DType::F32 => {
                let s = program.register(operands[0]);
                Value::Reg(program.emit(|dst| Instr::RoundBf16 { src: s, dst }))
            }
            // bool and bf16 values are exact in f32 registers.
            Op::Cast => operands[0],
            // A reduction's rows are accumulated where it is stored.
            Op::Reduce { .. } => operands[0],
            Op::RngUniform { stream } => {
                let input = seed.expect("the schedule names a random draw's seed");
                Value::Reg(program.emit(|dst| Instr::Random { input, stream: *stream, dst }))
            }
            // `fusible` (schedule/fusion.rs) admits none of these.
            other @ never_fused!() => unreachable!("{} is not fusible", other.name()),
        };
        value_of[m] = Some(result);
    }
    let mut output_dtypes = Vec::new();
    for (k, &m) in group.outputs.iter().enumerate() {
        let src = program.register(value_of[m].expect("built"));
        program.instrs.push(match graph.nodes[m].op {
            Op::Reduce { .. } if group.column_len > 0 => Instr::ColumnSum { src, out: k },
            Op::Reduce { op, .. } => Instr::ReduceStore { op, src, out: k },
            _ => Instr::Store { src, out: k },
        });
        output_dtypes.push(graph.nodes[m].dtype);
    }
    let (instrs, registers) = allocate_registers(program.instrs, program.registers);
    let gelu = if fast_paths { Gelu::recognise(&instrs) } else { None };
    let lanes = match (fast_paths, gelu) {
        (true, None) => {
            LaneProgram::compile(&instrs, &group.loads, registers, &group.shape, (group.reduce_inner, group.column_len))
        }
        (false, _) | (true, Some(_)) => None,
    };
    FusedProgram {
        shape: group.shape.clone(),
        loads: group.loads.clone(),
        instrs,
        registers,
        output_dtypes,
        reduce_inner: group.reduce_inner,
        column_len: group.column_len,
        gelu,
        lanes,
    }
}

fn reads(instr: &Instr) -> Vec<usize> {
    let reg = |s: &Src| match s {
        Src::Reg(r) => Some(*r),
        Src::Imm(_) => None,
    };
    match instr {
        Instr::Load { .. } | Instr::Random { .. } => vec![],
        Instr::Unary { src, .. }
        | Instr::ToBool { src, .. }
        | Instr::RoundBf16 { src, .. }
        | Instr::Store { src, .. }
        | Instr::ReduceStore { src, .. }
        | Instr::ColumnSum { src, .. } => vec![*src],
        Instr::Binary { a, b, .. } | Instr::Compare { a, b, .. } => [a, b].iter().filter_map(|s| reg(s)).collect(),
        Instr::Select { c, a, b, .. } => [c, a, b].iter().filter_map(|s| reg(s)).collect(),
    }
}

fn remap(instr: &mut Instr, map: &[usize]) {
    let fix = |s: &mut Src| {
        if let Src::Reg(r) = s {
            *r = map[*r];
        }
    };
    match instr {
        Instr::Load { dst, .. } | Instr::Random { dst, .. } => *dst = map[*dst],
        Instr::Unary { src, dst, .. } | Instr::ToBool { src, dst } | Instr::RoundBf16 { src, dst } => {
            *src = map[*src];
            *dst = map[*dst];
        }
        Instr::Binary { a, b, dst, .. } | Instr::Compare { a, b, dst, .. } => {
            fix(a);
            fix(b);
            *dst = map[*dst];
        }
        Instr::Select { c, a, b, dst } => {
            fix(c);
            fix(a);
            fix(b);
            *dst = map[*dst];
        }
        Instr::Store { src, .. } | Instr::ReduceStore { src, .. } | Instr::ColumnSum { src, .. } => *src = map[*src],
    }
}

fn writes(instr: &Instr) -> Option<usize> {
    match instr {
        Instr::Load { dst, .. }
        | Instr::Random { dst, .. }
        | Instr::Unary { dst, .. }
        | Instr::ToBool { dst, .. }
        | Instr::RoundBf16 { dst, .. }
        | Instr::Binary { dst, .. }
        | Instr::Compare { dst, .. }
        | Instr::Select { dst, .. } => Some(*dst),
        Instr::Store { .. } | Instr::ReduceStore { .. } | Instr::ColumnSum { .. } => None,
    }
}

/// Map virtual registers to few physical ones: a register is reused after
/// its last reader; a destination never shares a register with a source of
/// the same instruction.
fn allocate_registers(mut instrs: Vec<Instr>, virtual_regs: usize) -> (Vec<Instr>, usize) {
    let mut last = vec![0usize; virtual_regs];
    for (k, instr) in instrs.iter().enumerate() {
        for r in reads(instr) {
            last[r] = k;
        }
        if let Some(w) = writes(instr) {
            last[w] = last[w].max(k);
        }
    }
    let mut map = vec![usize::MAX; virtual_regs];
    let mut free: Vec<usize> = Vec::new();
    let mut physical = 0;
    for (k, instr) in instrs.iter().enumerate() {
        if let Some(w) = writes(instr) {
            map[w] = free.pop().unwrap_or_else(|| {
                physical += 1;
                physical - 1
            });
        }
        for r in reads(instr) {
            if last[r] == k && !free.contains(&map[r]) {
                free.push(map[r]);
            }
        }
        if let Some(w) = writes(instr) {
            if last[w] == k {
                free.push(map[w]);
            }
        }
    }
    for instr in &mut instrs {
        remap(instr, &map);
    }
    (instrs, physical)
}
