#include "kvmlib.h"
/* usage: t_gate [N] [scenario]
   Is a hypercall cheaper through a CPL0 gate (int3 from CPL3 to a DPL3 IDT gate that does the
   8-byte MMIO load at CPL0 and iretqs) than as the load itself at CPL3? Each scenario runs N
   iterations in a fresh VM and prints the guest-measured median, p10 and p90 (g_gate.S):
   0 the load at CPL0 (no privilege change); 1 the load at CPL3; 2 int3 to a gate that only
   iretqs; 3 int3 to a gate that does the load; 4 the same, stamped at CPL0 around the load
   (the exit inside the gate; the rest of the round trip); 5 a gate that does two loads;
   6 `int $0x41` through a DPL3 gate that only iretqs. */
static const char *names[] = {
  "CPL0 MMIO load", "CPL3 MMIO load (direct hypercall)", "CPL3 int3 -> CPL0 iretq",
  "CPL3 int3 gate: load at CPL0, iretq", "CPL3 int3 gate, stamped at CPL0",
  "CPL3 int3 gate: two loads at CPL0", "CPL3 int $0x41 -> CPL0 iretq",
};
#define NSCEN 7
static double median_us(uint64_t *v, int n){ qsort(v, n, 8, cmp_u64); return cyc2us(v[n / 2]); }
static void scenario(int s, int n){
  struct vm *vm = vm_create(); vm_load(vm, "g_gate.bin");
  struct vcpu *v = vcpu_create(vm, 0); get_tsc_khz(v);
  vcpu_longmode(v, CODE_BASE, s);
  SHM64(vm, SHM_ARG) = n;
  for (;;) {
    if (ioctl(v->fd, KVM_RUN, 0) < 0) { if (errno == EINTR) continue; DIE("KVM_RUN"); }
    struct kvm_run *r = v->run;
    if (r->exit_reason == KVM_EXIT_MMIO && r->mmio.phys_addr == MMIO_HC && !r->mmio.is_write) {
      memset(r->mmio.data, 0, 8); continue;
    }
    if (r->exit_reason == KVM_EXIT_IO && r->io.port == PORT_EXC) {
      printf("%d %-40s guest exception, vector %u\n", s, names[s], *(uint32_t *)((uint8_t *)r + r->io.data_offset));
      goto out;
    }
    if (std_exit(v)) break;
  }
  {
  uint64_t *g = (uint64_t *)(vm->mem + SAMPLES);
  qsort(g, n, 8, cmp_u64);
  printf("%d %-40s median %7.2f us  p10 %7.2f  p90 %7.2f\n", s, names[s], cyc2us(g[n / 2]),
    cyc2us(g[n / 10]), cyc2us(g[n * 9 / 10]));
  if (s == 4) {
    uint64_t *in = (uint64_t *)(vm->mem + SAMPLES + 0x100000), *out = (uint64_t *)(vm->mem + SAMPLES + 0x200000);
    static uint64_t exit_leg[1 << 17], rest[1 << 17];
    for (int i = 1; i < n; i++) { exit_leg[i - 1] = out[i] - in[i]; rest[i - 1] = in[i] - out[i - 1]; }
    printf("  %-40s median %7.2f us\n  %-40s median %7.2f us\n", "the load's exit, inside the gate",
      median_us(exit_leg, n - 1), "after it to the next gate's load", median_us(rest, n - 1));
  }
  }
out:
  fflush(stdout);
  munmap(v->run, vm->runsz); close(v->fd); close(vm->fd); munmap(vm->mem, MEM_SIZE);
}
int main(int argc, char **argv){
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  int only = argc > 2 ? atoi(argv[2]) : -1;
  if (n < 2 || n > (1 << 17)) { fprintf(stderr, "N must be in 2..131072\n"); return 2; }
  alarm(120);
  for (int s = 0; s < NSCEN; s++) if (only < 0 || only == s) scenario(s, n);
  return 0;
}
