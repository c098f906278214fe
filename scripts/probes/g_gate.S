#include "common.S"
/* Is a CPL0 hypercall gate cheaper than a direct load at CPL3? r14 = scenario (t_gate.c),
   SHM_ARG = iterations. Each iteration's guest TSC delta goes to SAMPLES; scenario 4 also
   stamps at CPL0 just before and just after its load (STAMP_IN, STAMP_OUT). */
#define STAMP_IN  (SAMPLES + 0x100000)
#define STAMP_OUT (SAMPLES + 0x200000)

.macro DPL3 vec
    movw $0xEE00, IDT_BASE + (\vec)*16 + 4
.endm

main:
    SETGATE 3, gate_iret
    cmp $3, %r14
    jne 1f
    SETGATE 3, gate_load
1:  cmp $4, %r14
    jne 2f
    SETGATE 3, gate_timed
2:  cmp $5, %r14
    jne 3f
    SETGATE 3, gate_load2
3:  DPL3 3
    SETGATE 0x41, gate_iret
    DPL3 0x41
    mov $SAMPLES, %r8
    mov SHM_ARG, %r9
    lea table(%rip), %rax
    mov (%rax,%r14,8), %rbx
    test %r14, %r14
    jz 4f
    TO_USER 4f, 0x2
4:  jmp *%rbx

.align 8
table:
    .quad s_load, s_load, s_int3, s_gate, s_gate, s_gate, s_int41

/* One timed operation per iteration; rax holds the slot address where a load is made. */
.macro LOOP name, op:vararg
\name:
1:  RDTSC64 %r12
    mov $MMIO_HC, %rax
    \op
    RDTSC64 %r13
    sub %r12, %r13
    mov %r13, (%r8)
    add $8, %r8
    dec %r9
    jnz 1b
    movl $1, MMIO_HC + 0x800
2:  jmp 2b
.endm

LOOP s_load, mov (%rax), %rax
LOOP s_int3, int3
LOOP s_gate, int3
LOOP s_int41, int $0x41

/* The CPL0 gates (IDT vector 3, DPL3). */
gate_iret:
    iretq
gate_load:
    mov (%rax), %rax
    iretq
gate_load2:
    push %rax
    mov (%rax), %rax
    pop %rax
    mov (%rax), %rax
    iretq
gate_timed:
    push %rdx
    push %rax
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, STAMP_IN - SAMPLES(%r8)
    pop %rax
    mov (%rax), %rax
    push %rax
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, STAMP_OUT - SAMPLES(%r8)
    pop %rax
    pop %rdx
    iretq
