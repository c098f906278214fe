#include "kvmlib.h"
/* usage: t_iwin <scenario 0-5> N <remedy: wait|kick|mp|msi> stuck_ms
   How long an MSI (vector 0x40) that became deliverable waits for its handler, and whether the
   guest ran CPL3 code meanwhile (a delivery KVM held back) or not (its thread waited for a CPU).
   Scenarios (g_iwin.S): 0 sent at CPL0 with IF=0, then iretq to CPL3; 1 the same, then sti at
   CPL0; 2 sent while the guest spins at CPL3; 3 sent while the CPL0 handler of vector 0x41
   runs, whose EOI is then sent at CPL3 (activm's stub); 4 as 2 with an MMIO exit every 64
   iterations; 5 as 4, sent by the vCPU thread itself while it handles an MMIO exit.
   Remedies for a wait over stuck_ms: wait; kick (exit and re-entry); mp (kick, then
   KVM_SET_MP_STATE runnable); msi (send it again). */
static struct vm *vm; static struct vcpu *v; static pthread_t vth;
static volatile int self_msi; static volatile uint64_t self_sent; static volatile long mmio_exits;
static volatile int stop_flag, remedy_mp, entries, want_irr, irr_seen;
static int irr40(void);
static void *vcpu_thread(void *a){
  for (;;) {
    int r = ioctl(v->fd, KVM_RUN, 0);
    if (r < 0 && errno == EINTR) {
      v->run->immediate_exit = 0;
      if (stop_flag) return NULL;
      if (want_irr) { irr_seen = irr40(); want_irr = 0; }
      if (remedy_mp) { struct kvm_mp_state mp = { .mp_state = KVM_MP_STATE_RUNNABLE }; CHK(ioctl(v->fd, KVM_SET_MP_STATE, &mp)); remedy_mp = 0; }
      entries++;
      continue;
    }
    if (r < 0) DIE("KVM_RUN");
    if (v->run->exit_reason == KVM_EXIT_MMIO && v->run->mmio.phys_addr == MMIO_HC) {
      mmio_exits++;
      if (self_msi) { self_msi = 0; struct kvm_msi m = { .address_lo = 0xFEE00000, .data = 0x40 }; CHK(ioctl(vm->fd, KVM_SIGNAL_MSI, &m)); self_sent = rdtsc(); }
      continue;
    }
    if (std_exit(v)) { fprintf(stderr, "unexpected DONE/HLT exit\n"); exit(1); }
  }
}
static void msi(int vec){ struct kvm_msi m = { .address_lo = 0xFEE00000, .data = vec }; CHK(ioctl(vm->fd, KVM_SIGNAL_MSI, &m)); }
static void kick(void){ v->run->immediate_exit = 1; pthread_kill(vth, SIGUSR1); }
static int irr40(void){ struct kvm_lapic_state l; if (ioctl(v->fd, KVM_GET_LAPIC, &l)) return -1; return (*(uint32_t*)&l.regs[0x200 + 0x20] & 1) != 0; }
int main(int argc, char **argv){
  if (argc < 5) { fprintf(stderr, "usage: t_iwin scenario N wait|kick|mp|msi stuck_ms\n"); return 1; }
  int sc = atoi(argv[1]), N = atoi(argv[2]); const char *rem = argv[3]; double stuck = atof(argv[4]) * 1000;
  install_kick_signal();
  vm = vm_create(); vm_load(vm, "g_iwin.bin");
  CHK(ioctl(vm->fd, KVM_CREATE_IRQCHIP, 0));
  v = vcpu_create(vm, 0); get_tsc_khz(v);
  vcpu_longmode(v, CODE_BASE, sc);
  pthread_create(&vth, NULL, vcpu_thread, NULL);
  uint64_t tw = rdtsc();
  while (SHM64(vm, SHM_READY) == 0) { if (cyc2us(rdtsc()-tw) > 5e6) DIE("guest not ready"); usleep(100); }
  static uint64_t lat[100000]; int n = 0, ngenuine = 0, stuckn = 0, rescued = 0, lost = 0, irr_when_stuck = 0;
  for (int i = 1; i <= N; i++) {
    uint64_t t0 = rdtsc();
    while (SHM64(vm, SHM_ARG) != (uint64_t)i) { if (cyc2us(rdtsc()-t0) > 2e6) { dump_regs(v); DIE("round %d: guest not ready (arg=%lu)", i, (unsigned long)SHM64(vm, SHM_ARG)); } }
    uint64_t seq0 = SHM64(vm, SHM_SEQ);
    SHM64(vm, SHM_ARG3) = 0;
    if (sc == 3) { msi(0x41); usleep(50); }
    uint64_t ts = rdtsc();
    if (sc == 5) { self_sent = 0; self_msi = 1; while (!self_sent) ; ts = self_sent; } else
    msi(0x40);
    SHM64(vm, SHM_ARG2) = i;
    /* wait for the handler, or for `stuck` after the guest reached CPL3 */
    int was_stuck = 0, genuine = 0; uint64_t tc = 0;
    for (;;) {
      uint64_t pub = SHM64(vm, SHM_PRIV);
      if (SHM64(vm, SHM_SEQ) != seq0) break;
      { uint64_t f = sc == 2 || sc >= 4 ? ts : tc; if (f && pub > f + (uint64_t)(tsc_khz) && !genuine) { genuine = 1; ngenuine++; } }
      uint64_t a3 = SHM64(vm, SHM_ARG3), now = rdtsc();
      if (sc != 2 && a3 && !tc) tc = a3;
      uint64_t from = sc == 2 || sc >= 4 ? ts : tc;
      if (from && !was_stuck && cyc2us(now - from) > stuck) {
        was_stuck = 1; stuckn++;
        if (!strcmp(rem, "kick") || !strcmp(rem, "mp")) {
          irr_seen = -2; want_irr = 1; if (!strcmp(rem, "mp")) remedy_mp = 1;
          kick(); while (irr_seen == -2) ;
          if (irr_seen == 1) irr_when_stuck++;
        } else if (!strcmp(rem, "msi")) msi(0x40);
      }
      if (cyc2us(now - ts) > 500000) { lost++; break; }
    }
    if (SHM64(vm, SHM_SEQ) == seq0) { fprintf(stderr, "round %d lost\n", i); dump_regs(v); break; }
    if (was_stuck) rescued++;
    uint64_t h = SHM64(vm, SHM_HTSC), from = sc == 2 || sc >= 4 ? ts : tc;
    lat[n++] = h > from && from ? h - from : 0;
    if (was_stuck && getenv("V")) printf("  round %d: handler %.1f ms after it became deliverable\n", i, cyc2us(h - from) / 1000);
  }
  printf("== scenario %d remedy %s: %d rounds, stuck over %.1f ms: %d (IRR 0x40 set then: %d), delivered after: %d, lost: %d; guest ran CPL3 code >1 ms after it was deliverable: %d\n",
         sc, rem, n, stuck / 1000, stuckn, irr_when_stuck, rescued, lost, ngenuine);
  if (n) report("  deliverable -> handler", lat, n);
  printf("  MMIO exits: %ld\n", mmio_exits);
  stop_flag = 1; kick(); pthread_join(vth, NULL);
  return 0;
}
