//! Initial x86_64 vCPU state, and register dumps for fault reports.

use kvm_bindings::{
    kvm_device_attr, kvm_mp_state, kvm_regs, kvm_segment, CpuId, KVM_MP_STATE_RUNNABLE,
    KVM_VCPU_TSC_CTRL, KVM_VCPU_TSC_OFFSET,
};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

// Not exposed by kvm-ioctls for x86_64 vCPU fds.
ioctl_iow_nr!(KVM_SET_DEVICE_ATTR, 0xAE, 0xe1, kvm_device_attr);
use protocol::arch::x86_64::{TrapFrame, KERNEL_CS, KERNEL_DS, TSS_SELECTOR_BASE};

use super::boot::gdt_limit;
use super::layout::*;
use crate::error::Error;
use crate::memory::{GuestRam, Plan};

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// The CPUID the guest sees: KVM's supported set with this vCPU's APIC id.
pub fn cpuid_for(supported: &CpuId, index: u32) -> CpuId {
    let mut cpuid = supported.clone();
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => entry.ebx = (entry.ebx & 0x00ff_ffff) | (index << 24),
            0xb | 0x1f => entry.edx = index,
            _ => {}
        }
    }
    cpuid
}

fn segment(selector: u16, code: bool, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl,
        db: if code { 0 } else { 1 },
        s: 1,
        l: if code { 1 } else { 0 },
        g: 1,
        ..Default::default()
    }
}

/// Put vCPU `index` at the guest's entry point: CPL0, long mode, the VMM's tables loaded.
pub fn configure(vcpu: &VcpuFd, cpuid: &CpuId, index: u32, plan: &Plan) -> Result<(), Error> {
    vcpu.set_cpuid2(&cpuid_for(cpuid, index))
        .map_err(Error::kvm("KVM_SET_CPUID2"))?;
    // Guest TSC = host TSC, so guest and VMM timestamps compare (boot timing, upcall latency).
    let offset: u64 = 0;
    let attr = kvm_device_attr {
        group: KVM_VCPU_TSC_CTRL,
        attr: KVM_VCPU_TSC_OFFSET as u64,
        addr: &offset as *const u64 as u64,
        flags: 0,
    };
    // SAFETY: KVM_SET_DEVICE_ATTR on a vCPU fd reads one `kvm_device_attr`, whose `addr`
    // points at `offset`, alive for the call. Best effort: without it only guest-internal
    // timings are meaningful.
    let _ = unsafe { ioctl_with_ref(vcpu, KVM_SET_DEVICE_ATTR(), &attr) };

    let mut sregs = vcpu.get_sregs().map_err(Error::kvm("KVM_GET_SREGS"))?;
    sregs.cs = segment(KERNEL_CS, true, 0);
    let data = segment(KERNEL_DS, false, 0);
    sregs.ds = data;
    sregs.es = data;
    sregs.ss = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.tr = kvm_segment {
        base: TSS_ADDR + index as u64 * TSS_STRIDE,
        limit: 0x67,
        selector: TSS_SELECTOR_BASE + 16 * index as u16,
        type_: 0xb,
        present: 1,
        ..Default::default()
    };
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = gdt_limit(plan.nr_vcpus);
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 256 * 16 - 1;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs)
        .map_err(Error::kvm("KVM_SET_SREGS"))?;

    let regs = kvm_regs {
        rip: plan.entry,
        rsp: rsp0_top(index as u64),
        rdi: BOOT_INFO_ADDR,
        rsi: index as u64,
        rdx: plan.user_stack_top(index),
        rflags: 0x2,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(Error::kvm("KVM_SET_REGS"))?;
    // With the in-kernel irqchip, application processors wait for SIPI: start them directly.
    vcpu.set_mp_state(kvm_mp_state {
        mp_state: KVM_MP_STATE_RUNNABLE,
    })
    .map_err(Error::kvm("KVM_SET_MP_STATE"))?;
    Ok(())
}

/// Current privilege level from a CS selector.
pub fn cpl(cs_selector: u64) -> u64 {
    cs_selector & 3
}

/// A register dump for fault reports (ioctls are fine here: this is the error path).
pub fn dump(vcpu: &VcpuFd) -> String {
    let (Ok(r), Ok(s)) = (vcpu.get_regs(), vcpu.get_sregs()) else {
        return "  (registers unavailable)".into();
    };
    let irq = interrupt_state(vcpu);
    let regs = format!(
        "  rip={:#018x} rsp={:#018x} rflags={:#x} cpl={} cs={:#x} ss={:#x}\n  \
         rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n  \
         rsi={:#018x} rdi={:#018x} rbp={:#018x} r8={:#018x}\n  \
         r9={:#018x} r10={:#018x} r11={:#018x} r12={:#018x}\n  \
         r13={:#018x} r14={:#018x} r15={:#018x}\n  \
         cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} fs.base={:#x} gs.base={:#x}",
        r.rip,
        r.rsp,
        r.rflags,
        s.cs.dpl,
        s.cs.selector,
        s.ss.selector,
        r.rax,
        r.rbx,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rbp,
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15,
        s.cr0,
        s.cr2,
        s.cr3,
        s.cr4,
        s.efer,
        s.fs.base,
        s.gs.base
    );
    format!("{regs}\n  {irq}")
}

/// The local APIC's in-service and requested vectors, its task and processor priorities, and
/// KVM's pending event and run (`KVM_MP_STATE_*`, 3 halted) state, for a stalled-guest report.
fn interrupt_state(vcpu: &VcpuFd) -> String {
    let apic = match vcpu.get_lapic() {
        Ok(apic) => {
            let word = |reg: usize| {
                let b = &apic.regs[reg..reg + 4];
                u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
            };
            let vectors = |base: usize| {
                (0..8)
                    .flat_map(|w| {
                        let bits = word(base + 16 * w);
                        (0..32)
                            .filter(move |b| bits & (1 << b) != 0)
                            .map(move |b| w * 32 + b)
                    })
                    .map(|v| format!("{v:#x}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            format!(
                "apic: isr=[{}] irr=[{}] tpr={:#x} ppr={:#x} svr={:#x} lvt_timer={:#x} timer_count={}",
                vectors(0x100),
                vectors(0x200),
                word(0x80),
                word(0xa0),
                word(0xf0),
                word(0x320),
                word(0x390)
            )
        }
        Err(e) => format!("apic: unavailable ({e})"),
    };
    let events = match vcpu.get_vcpu_events() {
        Ok(ev) => format!(
            "events: interrupt injected={} nr={:#x} soft={} shadow={} exception injected={} nr={} pending={} nmi injected={} pending={}",
            ev.interrupt.injected,
            ev.interrupt.nr,
            ev.interrupt.soft,
            ev.interrupt.shadow,
            ev.exception.injected,
            ev.exception.nr,
            ev.exception.pending,
            ev.nmi.injected,
            ev.nmi.pending
        ),
        Err(e) => format!("events: unavailable ({e})"),
    };
    let mp_state = match vcpu.get_mp_state() {
        Ok(state) => format!("mp_state={}", state.mp_state),
        Err(e) => format!("mp_state unavailable ({e})"),
    };
    format!("{apic}\n  {events} {mp_state}")
}

/// The name of an exception vector.
pub fn exception_name(vector: u64) -> &'static str {
    match vector {
        0 => "#DE divide error",
        1 => "#DB debug",
        2 => "NMI",
        3 => "#BP breakpoint",
        4 => "#OF overflow",
        5 => "#BR bound range",
        6 => "#UD invalid opcode",
        7 => "#NM device not available",
        8 => "#DF double fault",
        10 => "#TS invalid TSS",
        11 => "#NP segment not present",
        12 => "#SS stack fault",
        13 => "#GP general protection",
        14 => "#PF page fault",
        16 => "#MF x87 error",
        17 => "#AC alignment check",
        18 => "#MC machine check",
        19 => "#XM SIMD error",
        _ => "interrupt",
    }
}

/// Report the exception the CPL0 stub could not handle (its `fatal_trap` hypercall).
pub fn fatal_trap_report(fd: &VcpuFd, index: u32, ram: &GuestRam) -> String {
    let frame: TrapFrame = match ram.read_struct(fd.sync_regs().regs.rsp) {
        Ok(frame) => frame,
        Err(e) => return format!("fatal trap on vCPU {index} with an unreadable frame: {e}"),
    };
    let mut report = format!(
        "vCPU {index}: unhandled {} (vector {}) at CPL{}: rip={:#x} rsp={:#x} error code={:#x}",
        exception_name(frame.vector),
        frame.vector,
        cpl(frame.cs),
        frame.rip,
        frame.rsp,
        frame.error_code
    );
    if frame.vector == 14 {
        if let Ok(sregs) = fd.get_sregs() {
            report += &format!(" cr2={:#x}", sregs.cr2);
        }
        let e = frame.error_code;
        report += &format!(
            " ({} {} {})",
            if e & 4 != 0 { "user" } else { "supervisor" },
            if e & 2 != 0 { "write" } else { "read" },
            if e & 1 != 0 {
                "protection violation"
            } else {
                "of an unmapped page"
            }
        );
    }
    report += &format!("\n  rax={:#x} (at the trap)\n{}", frame.rax, dump(fd));
    report
}
