#include "common.S"
/* r14 = scenario:
   0: the MSI arrives at CPL0 with IF=0 (cli spin); the guest then iretqs to CPL3 with IF=1
   1: as 0, but the guest does sti at CPL0 and spins there before the iretq
   2: control: the MSI arrives while the guest spins at CPL3 with IF=1
   3: activm's pattern: vector 0x41 interrupts CPL3; its CPL0 handler (IF=0) waits while the
      MSI (0x40) arrives, iretqs to CPL3, where the EOI of 0x41 is sent
   4, 5: as 2, with an MMIO load (an exit to the VMM) every 64 iterations of the CPL3 loop
   Every CPL3 loop publishes the TSC in SHM_PRIV: the host sees whether the guest ran.
   r13 = round. SHM_ARG: guest ready for round r13; SHM_ARG2: host sent the MSI for round r13;
   SHM_ARG3: tsc when the guest reached CPL3 after the send. */
#define KSTACK (STACKS + 0xC000)
main:
    XAPIC_ENABLE
    SETGATE VEC_MSI, h_msi
    SETGATE VEC_TIMER, h_first
    SETGATE VEC_SPUR, h_spur
    xor %r13, %r13
    lock incq SHM_READY
    cmp $2, %r14
    je round3
    cmp $3, %r14
    je round3
    cmp $4, %r14
    jae round3
round:                          /* CPL0, IF=0 */
    inc %r13
    mov %r13, SHM_ARG
1:  cmp SHM_ARG2, %r13
    jne 1b
    mov $20, %rcx
2:  dec %rcx
    jnz 2b
    cmp $1, %r14
    jne 4f
    sti
    mov $20, %rcx
3:  dec %rcx
    jnz 3b
    cli
4:  TO_USER user0, 0x202
user0:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_ARG3
5:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_PRIV
    jmp 5b

round3:                         /* CPL0, IF=0: go to CPL3 and wait there */
    inc %r13
    TO_USER user3, 0x202
user3:
    mov %r13, SHM_ARG
    cmp $4, %r14
    jae user4
6:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_PRIV
    jmp 6b

user4:
    xor %rbx, %rbx
9:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_PRIV
    inc %rbx
    test $63, %rbx
    jnz 9b
    mov $MMIO_HC, %rax
    mov (%rax), %rax
    jmp 9b

h_first:                        /* 0x41 at CPL0 from CPL3 (scenario 3) */
7:  cmp SHM_ARG2, %r13
    jne 7b
    movq $user3_eoi, (%rsp)     /* iretq to the CPL3 EOI, IF=1 (frame's rflags) */
    iretq
user3_eoi:
    mov $0xFEE000B0, %eax
    movl $0, (%rax)
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_ARG3
8:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, SHM_PRIV
    jmp 8b

h_msi:                          /* 0x40, CPL0, IF=0 */
    rdtsc
    mov %eax, SHM_HTSC
    mov %edx, SHM_HTSC+4
    mov $0xFEE000B0, %eax
    movl $0, (%rax)
    lock incq SHM_SEQ
    mov $KSTACK, %rsp
    cmp $2, %r14
    jae round3
    jmp round
h_spur:
    iretq
