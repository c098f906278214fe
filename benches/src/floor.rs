//! The platform floor for booting: create a VM with the same memory as activm, one vCPU in
//! long mode, and run it to its first exit (a load from an address with no memory). Nothing
//! activm does beyond this is free; the ratio to this floor is what activm's design costs.

use kvm_bindings::{kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit};

const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const CODE: u64 = 0x20_0000;
/// `mov rax, [0xFEB00000]` (movabs), the first and only instruction.
const LOAD_UNBACKED: [u8; 10] = [0x48, 0xa1, 0x00, 0x00, 0xb0, 0xfe, 0x00, 0x00, 0x00, 0x00];

/// A bare long-mode VM: identity-mapped 2 MiB page for `code` at `CODE`, one vCPU at its
/// first instruction at CPL0 or CPL3, nothing else. Its memory is leaked (benchmark helper).
#[derive(Debug)]
pub struct BareVm {
    pub vm: kvm_ioctls::VmFd,
    pub vcpu: kvm_ioctls::VcpuFd,
}

impl BareVm {
    pub fn new(mem_size: usize, code: &[u8], user: bool) -> BareVm {
        let kvm = Kvm::new().expect("open /dev/kvm");
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        // SAFETY: an anonymous private mapping with no address hint; checked below.
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mem_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(mem, libc::MAP_FAILED, "mmap guest memory");
        let mem = mem as *mut u8;
        let write_u64 = |gpa: u64, value: u64| {
            assert!(gpa as usize + 8 <= mem_size);
            // SAFETY: `gpa + 8` lies inside the `mem_size`-byte mapping.
            unsafe { (mem.add(gpa as usize) as *mut u64).write_unaligned(value) }
        };
        let u = if user { 4 } else { 0 };
        write_u64(PML4, PDPT | 3 | u);
        write_u64(PDPT, PD | 3 | u);
        write_u64(PD + 8, CODE | 0x83 | u);
        // The 2 MiB page holding 0xFEB00000, unbacked: a load there is an MMIO exit.
        write_u64(PDPT + 8 * 3, (PD + 0x1000) | 3 | u);
        write_u64(PD + 0x1000 + 8 * 501, 0xFEA0_0000 | 0x9b | u);
        assert!(CODE as usize + code.len() <= mem_size);
        // SAFETY: CODE + code.len() bytes lie inside the mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), mem.add(CODE as usize), code.len()) };
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: mem_size as u64,
            userspace_addr: mem as u64,
        };
        // SAFETY: the mapping is never unmapped (leaked), so it outlives the VM.
        unsafe { vm.set_user_memory_region(region) }.expect("set memory region");
        let vcpu = vm.create_vcpu(0).expect("KVM_CREATE_VCPU");
        let mut sregs = vcpu.get_sregs().expect("get sregs");
        let dpl = if user { 3 } else { 0 };
        let (cs, ds) = if user { (0x23, 0x1b) } else { (8, 16) };
        sregs.cs = kvm_segment {
            selector: cs,
            type_: 0xb,
            present: 1,
            dpl,
            s: 1,
            l: 1,
            g: 1,
            limit: 0xffff_ffff,
            ..Default::default()
        };
        let data = kvm_segment {
            selector: ds,
            type_: 3,
            present: 1,
            dpl,
            s: 1,
            db: 1,
            g: 1,
            limit: 0xffff_ffff,
            ..Default::default()
        };
        sregs.ds = data;
        sregs.es = data;
        sregs.ss = data;
        sregs.cr0 = 0x8000_0011 | (1 << 5);
        sregs.cr3 = PML4;
        sregs.cr4 = 1 << 5;
        sregs.efer = 0x500;
        vcpu.set_sregs(&sregs).expect("set sregs");
        let mut regs = vcpu.get_regs().expect("get regs");
        regs.rip = CODE;
        regs.rsp = CODE + 0x10_0000;
        regs.rflags = if user { 0x202 } else { 2 };
        vcpu.set_regs(&regs).expect("set regs");
        BareVm { vm, vcpu }
    }
}

/// Boot a minimal VM with `mem_size` bytes of RAM to its first exit; returns the host TSC
/// when that exit came back to user space.
pub fn boot_to_first_exit(mem_size: usize) -> u64 {
    let mut bare = BareVm::new(mem_size, &LOAD_UNBACKED, false);
    match bare.vcpu.run().expect("KVM_RUN") {
        VcpuExit::MmioRead(..) => activm::rdtsc(),
        other => panic!("floor guest: unexpected exit {other:?}"),
    }
}

/// The raw cost of a kick: a bare VM spins at CPL3; another thread sends the vCPU thread a
/// signal whose handler sets `immediate_exit`, and the time until `KVM_RUN` returns `EINTR` is
/// one sample (microseconds). The same mechanism activm's preemption starts with.
pub fn kick_latency(samples: usize) -> Vec<f64> {
    use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
    use std::sync::Arc;

    static RUN: AtomicPtr<kvm_bindings::kvm_run> = AtomicPtr::new(std::ptr::null_mut());
    extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let run = RUN.load(Ordering::Acquire);
        if !run.is_null() {
            // SAFETY: `run` is the live kvm_run mapping of the vCPU this thread runs.
            unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 1) };
        }
    }
    let signal = libc::SIGRTMIN() + 1;
    // SAFETY: installs a plain async-signal-safe handler for a real-time signal nobody else uses
    // in this benchmark process.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_kick as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }

    // `pause; jmp .-2` at CPL3.
    let mut bare = BareVm::new(4 << 20, &[0xf3, 0x90, 0xeb, 0xfc], true);
    let vcpu = &mut bare.vcpu;
    RUN.store(vcpu.get_kvm_run() as *mut _, Ordering::Release);

    let thread_id = Arc::new(AtomicU64::new(0));
    let sent_at = Arc::new(AtomicU64::new(0));
    let kicker = {
        let thread_id = Arc::clone(&thread_id);
        let sent_at = Arc::clone(&sent_at);
        std::thread::spawn(move || {
            while thread_id.load(Ordering::Acquire) == 0 {
                std::hint::spin_loop();
            }
            for _ in 0..samples {
                std::thread::sleep(std::time::Duration::from_micros(300));
                sent_at.store(activm::rdtsc(), Ordering::Release);
                // SAFETY: the id is the live benchmark thread running the vCPU.
                unsafe {
                    libc::pthread_kill(thread_id.load(Ordering::Acquire) as libc::pthread_t, signal)
                };
                while sent_at.load(Ordering::Acquire) != 0 {
                    std::hint::spin_loop();
                }
            }
        })
    };
    // SAFETY: pthread_self has no preconditions.
    thread_id.store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
    let khz = activm::tsc_khz_estimate() as f64;
    let mut out = Vec::with_capacity(samples);
    while out.len() < samples {
        match vcpu.run() {
            Err(e) if e.errno() == libc::EINTR => {
                let now = activm::rdtsc();
                vcpu.set_kvm_immediate_exit(0);
                let sent = sent_at.swap(0, Ordering::AcqRel);
                if sent != 0 {
                    out.push(now.saturating_sub(sent) as f64 * 1000.0 / khz);
                }
            }
            Err(e) => panic!("KVM_RUN: {e}"),
            Ok(exit) => panic!("raw kick guest: unexpected exit {exit:?}"),
        }
    }
    RUN.store(std::ptr::null_mut(), Ordering::Release);
    kicker.join().expect("kicker");
    out
}
