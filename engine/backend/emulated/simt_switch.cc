// kvpr_emu_switch(save_sp, new_sp) for the SIMT emulator's fibers (simt_emu.h), x86-64 SysV:
// pushes the callee-saved registers and the SSE/x87 control words on the current stack,
// stores the stack pointer in *save_sp, loads new_sp and pops the same from there. The
// caller-saved registers are the compiler's business at the call, as for any call.
#if defined(__x86_64__) && defined(__linux__)
// The assembly keeps to its own sections (push/pop): the compiler's code after it, such as
// AddressSanitizer's module constructor, stays in the sections the compiler chose.
asm(R"(
  .pushsection .text
  .globl kvpr_emu_switch
  .type kvpr_emu_switch, @function
kvpr_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvpr_emu_switch, .-kvpr_emu_switch
  .popsection
  .pushsection .note.GNU-stack, "", @progbits
  .popsection
)");
#endif
