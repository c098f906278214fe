use super::*;

const TABLE: u64 = 0x1000;
const HEAD: u64 = 0x3000;
const TCBS: u64 = 0x4000;
const WORDS: u64 = 0x8000;
const NAMES: u64 = 0x9000;
const STACK: u64 = 0xa000;
const TCB_SIZE: u64 = 0x100;

fn layout() -> TcbLayout {
    TcbLayout {
        size: TCB_SIZE as u32,
        next: 8,
        id: 16,
        refs: 24,
        wake: 28,
        event: 32,
        flags: 36,
        sp: 40,
        sleep: 48,
        name_ptr: 56,
        name_len: 64,
        name_delta: 16,
    }
}

/// A guest memory with a valid table: one vCPU running thread #1 ('main'), thread #2 'worker'
/// parked with a code address on its stack, and a free TCB.
fn guest() -> GuestRam {
    let ram = GuestRam::new(2 << 20).unwrap();
    let vcpu = VcpuDiag {
        current: WORDS,
        in_sched: WORDS + 8,
        idle: WORDS + 16,
        timer: WORDS + 24,
        runq_head: WORDS + 32,
        runq_tail: WORDS + 36,
        runq_next: WORDS + 40,
        _reserved: 0,
    };
    let mut vcpus = [VcpuDiag::default(); MAX_VCPUS];
    vcpus[0] = vcpu;
    let table = RuntimeDiag {
        magic: DIAG_MAGIC,
        size: size_of::<RuntimeDiag>() as u32,
        nr_vcpus: 1,
        threads: HEAD,
        halted: WORDS + 48,
        spinning: WORDS + 56,
        global_len: WORDS + 64,
        tcb: layout(),
        vcpus,
    };
    ram.write_struct(TABLE, &table).unwrap();
    ram.write_u64(HEAD, TCBS).unwrap();
    let tcb = |i: u64, id: u64, name: &str, wake: u32, event: u32, next: u64| {
        let at = TCBS + i * TCB_SIZE;
        ram.write_u64(at + 8, next).unwrap();
        ram.write_u64(at + 16, id).unwrap();
        ram.write_u32(at + 24, u32::from(id != 0)).unwrap();
        ram.write_u32(at + 28, wake).unwrap();
        ram.write_u32(at + 32, event).unwrap();
        ram.write_u64(at + 40, STACK).unwrap();
        let text = NAMES + i * 64;
        ram.write_bytes(text, name.as_bytes()).unwrap();
        ram.write_u64(at + 56, text - 16).unwrap();
        ram.write_u64(at + 64, name.len() as u64).unwrap();
    };
    tcb(0, 1, "main", 0, 3 << 8, TCBS + TCB_SIZE);
    tcb(1, 2, "worker", WAKE_PARKED, 4 << 8, TCBS + 2 * TCB_SIZE);
    tcb(2, 0, "", 0, 0, 0);
    ram.write_u32(TCBS + 36, TCB_FLAG_MAIN).unwrap();
    ram.write_u64(WORDS, TCBS).unwrap();
    ram.write_u32(WORDS + 36, 3).unwrap();
    ram.write_u64(STACK + 16, 0x20_1234).unwrap();
    ram
}

fn context() -> Context {
    Context {
        table: TABLE,
        nr_vcpus: 1,
        image: 0x20_0000..0x30_0000,
        now_tsc: 1_000_000,
        tsc_khz: 1000,
        max_tcbs: MAX_TCBS,
    }
}

#[test]
fn a_valid_table_names_vcpus_and_threads() {
    let text = describe(&guest(), &context());
    assert!(
        text.contains("runtime vCPU 0: thread #1; in scheduler no, idle no; timer not armed; run queue 3, next none"),
        "{text}"
    );
    assert!(
        text.contains("thread #1 'main' (main): running on vCPU 0"),
        "{text}"
    );
    assert!(
        text.contains("thread #2 'worker': blocked (parked); last event parked on vCPU 0, wake word PARKED, code addresses on its stack (sp 0xa000): 0x201234"),
        "{text}"
    );
    assert!(
        text.contains("runtime: 2 live threads (2 listed above, 0 not)"),
        "{text}"
    );
}

#[test]
fn an_overdue_timer_and_sleeper_are_named() {
    let ram = guest();
    ram.write_u64(WORDS + 24, 400_000).unwrap();
    ram.write_u64(TCBS + TCB_SIZE + 48, 2_000_000).unwrap();
    let text = describe(&ram, &context());
    assert!(text.contains("timer armed, OVERDUE by 600 ms"), "{text}");
    assert!(text.contains("sleeping: due in 1000 ms"), "{text}");
}

#[test]
fn no_table_or_a_bad_one_is_said_plainly() {
    let ram = guest();
    let cx = |table| Context { table, ..context() };
    assert!(describe(&ram, &cx(0)).contains("no thread table published"));
    assert!(describe(&ram, &cx(u64::MAX - 4)).contains("outside RAM"));
    assert!(describe(&ram, &cx(TABLE + 8)).contains("no valid thread table"));
    // A TCB layout whose fields lie past its size.
    ram.write_u32(TABLE + offset_of!(RuntimeDiag, tcb) as u64, 16)
        .unwrap();
    assert!(describe(&ram, &cx(TABLE)).contains("impossible TCB layout"));
}

#[test]
fn a_looping_or_escaping_list_ends() {
    let ram = guest();
    // The free TCB points back at the first one.
    ram.write_u64(TCBS + 2 * TCB_SIZE + 8, TCBS).unwrap();
    let text = describe(&ram, &context());
    assert!(text.contains("thread list loops back to 0x4000"), "{text}");
    assert!(text.contains("2 live threads"), "{text}");
    ram.write_u64(TCBS + 2 * TCB_SIZE + 8, u64::MAX - 8)
        .unwrap();
    assert!(describe(&ram, &context()).contains("thread list leaves RAM"));
}

#[test]
fn hostile_names_and_words_are_clamped() {
    let ram = guest();
    // A name of a gigabyte with control characters, a name pointer outside RAM.
    ram.write_bytes(NAMES, b"a\x1b[2Jb").unwrap();
    ram.write_u64(TCBS + 64, 1 << 30).unwrap();
    ram.write_u64(TCBS + TCB_SIZE + 56, u64::MAX - 100).unwrap();
    // vCPU words pointing nowhere.
    ram.write_struct(
        TABLE + offset_of!(RuntimeDiag, vcpus) as u64,
        &VcpuDiag {
            current: u64::MAX,
            ..Default::default()
        },
    )
    .unwrap();
    let text = describe(
        &ram,
        &Context {
            nr_vcpus: 64,
            ..context()
        },
    );
    assert!(!text.contains('\x1b'), "{text}");
    assert!(text.contains("'a?[2Jb"), "{text}");
    assert!(text.contains("..."), "{text}");
    assert!(text.contains("outside RAM)"), "{text}");
    assert!(text.contains("current thread unreadable"), "{text}");
    // nr_vcpus in the table (1) bounds the vCPU lines, whatever the guest has.
    assert!(!text.contains("runtime vCPU 1:"), "{text}");
}

#[test]
fn a_long_list_is_cut() {
    let ram = GuestRam::new(4 << 20).unwrap();
    const CUT: usize = 4096;
    let mut table = RuntimeDiag {
        magic: DIAG_MAGIC,
        size: size_of::<RuntimeDiag>() as u32,
        nr_vcpus: 0,
        threads: HEAD,
        halted: 0,
        spinning: 0,
        global_len: 0,
        tcb: layout(),
        vcpus: [VcpuDiag::default(); MAX_VCPUS],
    };
    table.tcb.size = 64;
    table.tcb.name_ptr = 0;
    table.tcb.name_len = 0;
    table.tcb.sleep = 0;
    table.tcb.sp = 0;
    ram.write_struct(TABLE, &table).unwrap();
    ram.write_u64(HEAD, 0x10_0000).unwrap();
    for i in 0..(CUT as u64 + 10) {
        let at = 0x10_0000 + i * 64;
        ram.write_u64(at + 8, at + 64).unwrap();
        ram.write_u64(at + 16, i + 1).unwrap();
        ram.write_u32(at + 24, 1).unwrap();
        ram.write_u32(at + 28, WAKE_PARKED).unwrap();
    }
    let text = describe(
        &ram,
        &Context {
            max_tcbs: CUT,
            ..context()
        },
    );
    assert!(text.contains(&format!("cut after {CUT} entries")), "{text}");
    assert!(
        text.contains(&format!(
            "{CUT} live threads ({MAX_LISTED} listed above, {} not)",
            CUT - MAX_LISTED
        )),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("thread #")).count(),
        MAX_LISTED
    );
}

#[test]
fn the_interrupt_watch_reads_a_timer_word_and_nothing_else_it_is_not_given() {
    let ram = guest();
    assert_eq!(timer_word(&ram, TABLE, 0), TimerWord::NotArmed);
    ram.write_u64(WORDS + 24, 400_000).unwrap();
    assert_eq!(timer_word(&ram, TABLE, 0), TimerWord::Armed(400_000));
    // vCPU 1's entry points nowhere (address 0 holds 0: not armed); past MAX_VCPUS, unknown.
    assert_eq!(timer_word(&ram, TABLE, 1), TimerWord::NotArmed);
    assert_eq!(
        timer_word(&ram, TABLE, MAX_VCPUS as u32),
        TimerWord::Unknown
    );
    // No table, a table outside RAM or wrapping around, a table without its magic.
    for table in [0, u64::MAX - 4, 3 << 20, TABLE + 8] {
        assert_eq!(timer_word(&ram, table, 0), TimerWord::Unknown, "{table:#x}");
    }
    // The word's address outside RAM.
    let field = TABLE + (offset_of!(RuntimeDiag, vcpus) + offset_of!(VcpuDiag, timer)) as u64;
    ram.write_u64(field, u64::MAX - 2).unwrap();
    assert_eq!(timer_word(&ram, TABLE, 0), TimerWord::Unknown);
}
