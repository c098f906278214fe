#include "common.S"
/* Waking from halt: the halt hypercall (a load at CPL3; the VMM sets KVM_MP_STATE_HALTED) or a
   CPL0 gate (int3 to a DPL3 gate that does `sti; hlt` and iretqs). r14 = 0 hypercall, 1 gate;
   SHM_ARG = iterations. Iteration i stores i to SHM_READY, halts, and on its way back stamps
   the TSC at CPL3 into SAMPLES[i - 1]; t_halt.c sends the MSI that wakes it. */
main:
    XAPIC_ENABLE
    SETGATE 0x40, on_irq
    SETGATE 3, gate_halt
    movw $0xEE00, IDT_BASE + 3*16 + 4
    mov $SAMPLES, %r8
    mov SHM_ARG, %r9
    xor %r10, %r10
    TO_USER 1f, 0x202
1:  inc %r10
    mov %r10, SHM_READY
    test %r14, %r14
    jnz 2f
    mov $MMIO_HC, %rax
    mov (%rax), %rax
    jmp 3f
2:  int3
3:  RDTSC64 %r13
    mov %r13, (%r8)
    add $8, %r8
    dec %r9
    jnz 1b
    movl $1, MMIO_HC + 0x800
4:  jmp 4b

/* CPL0: the wake-up interrupt, from CPL3 or from the gate's hlt. */
on_irq:
    push %rax
    mov $0xFEE000B0, %eax
    movl $0, (%rax)
    pop %rax
    iretq
gate_halt:
    sti
    hlt
    iretq
