#include "kvmlib.h"
/* usage: t_halt [N] [delay_us]
   Halting and waking a vCPU that runs at CPL3: the halt hypercall (a load from CPL3; the VMM
   answers with KVM_SET_MP_STATE(HALTED)) against a CPL0 gate (int3 to a DPL3 IDT gate that does
   `sti; hlt` and iretqs, no exit to user space). Each round the guest halts, this program waits
   delay_us (default 500: past KVM's halt polling), sends an MSI, and the guest stamps the TSC
   back at CPL3. Prints the median and p90 from the MSI to that stamp, and the vCPU thread's
   CPU time per round (g_halt.S). */
static struct vm *vm; static int n, delay_us;
static uint64_t sent[1 << 16];
static void *sender(void *a){
  (void)a;
  for (int i = 1; i <= n; i++) {
    while (SHM64(vm, SHM_READY) != (uint64_t)i) usleep(20);
    usleep(delay_us);
    struct kvm_msi m = { .address_lo = 0xFEE00000, .data = 0x40 };
    sent[i - 1] = rdtsc();
    CHK(ioctl(vm->fd, KVM_SIGNAL_MSI, &m));
  }
  return NULL;
}
static void run(int gate){
  vm = vm_create(); CHK(ioctl(vm->fd, KVM_CREATE_IRQCHIP, 0)); vm_load(vm, "g_halt.bin");
  struct vcpu *v = vcpu_create(vm, 0); get_tsc_khz(v);
  vcpu_longmode(v, CODE_BASE, gate);
  SHM64(vm, SHM_ARG) = n;
  pthread_t t; pthread_create(&t, NULL, sender, NULL);
  struct timespec c0, c1; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  for (;;) {
    if (ioctl(v->fd, KVM_RUN, 0) < 0) { if (errno == EINTR) continue; DIE("KVM_RUN"); }
    struct kvm_run *r = v->run;
    if (r->exit_reason == KVM_EXIT_MMIO && r->mmio.phys_addr == MMIO_HC && !r->mmio.is_write) {
      memset(r->mmio.data, 0, 8);
      struct kvm_mp_state mp = { .mp_state = KVM_MP_STATE_HALTED };
      CHK(ioctl(v->fd, KVM_SET_MP_STATE, &mp));
      continue;
    }
    if (std_exit(v)) break;
  }
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  pthread_join(t, NULL);
  static uint64_t lat[1 << 16];
  uint64_t *stamp = (uint64_t *)(vm->mem + SAMPLES);
  for (int i = 0; i < n; i++) lat[i] = stamp[i] - sent[i];
  qsort(lat, n, 8, cmp_u64);
  double cpu = ((c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec)) / 1e3 / n;
  printf("%-34s MSI to CPL3: median %7.2f us  p90 %7.2f | vCPU thread CPU %6.2f us/round\n",
    gate ? "halt through a CPL0 gate (sti; hlt)" : "halt hypercall (load, MP_STATE)",
    cyc2us(lat[n / 2]), cyc2us(lat[n * 9 / 10]), cpu);
  fflush(stdout);
  munmap(v->run, vm->runsz); close(v->fd); close(vm->fd); munmap(vm->mem, MEM_SIZE);
}
int main(int argc, char **argv){
  n = argc > 1 ? atoi(argv[1]) : 300;
  delay_us = argc > 2 ? atoi(argv[2]) : 500;
  if (n < 2 || n > (1 << 16)) { fprintf(stderr, "N must be in 2..65536\n"); return 2; }
  alarm(120);
  for (int r = 0; r < 2; r++) { run(0); run(1); }
  return 0;
}
