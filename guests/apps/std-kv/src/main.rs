//! A small Redis-compatible key-value server: RESP over TCP, one thread per connection, the
//! data in one `HashMap` behind a `Mutex`. Enough of Redis for `redis-benchmark -t set,get`
//! and `redis-cli`: PING, ECHO, GET, SET, DEL, EXISTS, INCR, DBSIZE, FLUSHALL, CONFIG GET
//! (save / appendonly: redis-benchmark asks), COMMAND, QUIT. Pipelining works by itself:
//! replies are buffered and flushed when no request is left in the input buffer.
//!
//! Usage: `std-kv [PORT]` (default 6379), listening on 0.0.0.0; `std-kv ping HOST:PORT` is a
//! client instead: it sends PING to a server there and prints the reply. `std-kv blast HOST:PORT
//! N M` sends N bytes (`i % 251`) on one connection and closes it non-blocking, then M bytes on
//! a second connection and exits without closing it (`std::process::exit`). `std-kv netopts
//! PORT REFUSED` tries timeouts, `try_clone`, `connect_timeout` and `localhost` (`netopts.rs`).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

type Store = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

/// Longest bulk string or array accepted (a bad client gets an error, not an allocation).
const MAX_BULK: usize = 64 << 20;
const MAX_ARGS: usize = 1 << 20;

mod netopts;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("netopts") {
        let port = |i| {
            std::env::args()
                .nth(i)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0)
        };
        let listen = std::env::args().nth(4).and_then(|p| p.parse().ok());
        netopts::run(port(2), port(3), listen);
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("ping") {
        let to = std::env::args().nth(2).unwrap_or_default();
        match ping(&to) {
            Ok(reply) => println!("std-kv: {to} answered {reply}"),
            Err(e) => {
                println!("std-kv: cannot ping {to}: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("blast") {
        let to = std::env::args().nth(2).unwrap_or_default();
        let count = |i| {
            std::env::args()
                .nth(i)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let (closed, open) = (count(3), count(4));
        if let Err(e) = blast(&to, closed, open) {
            println!("std-kv: cannot blast {to}: {e}");
            std::process::exit(1);
        }
        println!("std-kv: sent {closed} and {open} bytes");
        std::process::exit(0);
    }
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(6379);
    let listener = match TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("std-kv: cannot listen on port {port}: {e}");
            std::process::exit(1);
        }
    };
    println!("std-kv: listening on port {port}");
    let store: Store = Arc::default();
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let _ = serve(stream, &store);
                });
            }
            Err(e) => eprintln!("std-kv: accept: {e}"),
        }
    }
}

/// Sends PING to the server at `to`; its first reply line.
fn ping(to: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect(to)?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

/// Sends `closed` bytes to `to` and closes the stream non-blocking (it returns before they
/// are all sent), then `open` bytes on a second stream that stays open: the caller exits.
fn blast(to: &str, closed: usize, open: usize) -> io::Result<()> {
    let data = |n: usize| (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let mut first = TcpStream::connect(to)?;
    first.write_all(&data(closed))?;
    first.set_nonblocking(true)?;
    drop(first);
    let mut second = TcpStream::connect(to)?;
    second.write_all(&data(open))?;
    std::mem::forget(second);
    Ok(())
}

fn serve(stream: TcpStream, store: &Store) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    // Reader and writer share the connection (`&TcpStream` reads and writes; no `dup`).
    let mut reader = BufReader::with_capacity(16 << 10, &stream);
    let mut out = BufWriter::with_capacity(16 << 10, &stream);
    let mut line = Vec::new();
    loop {
        let Some(args) = read_command(&mut reader, &mut line)? else {
            out.flush()?;
            return Ok(());
        };
        let quit = execute(&args, store, &mut out)?;
        if quit || reader.buffer().is_empty() {
            out.flush()?;
        }
        if quit {
            return Ok(());
        }
    }
}

/// One RESP array of bulk strings (or an inline command); `None` at end of stream.
fn read_command(r: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Option<Vec<Vec<u8>>>> {
    line.clear();
    if r.read_until(b'\n', line)? == 0 {
        return Ok(None);
    }
    let text = trim_crlf(line);
    if text.first() != Some(&b'*') {
        // Inline command: words separated by spaces.
        return Ok(Some(
            text.split(|&b| b == b' ')
                .filter(|w| !w.is_empty())
                .map(<[u8]>::to_vec)
                .collect(),
        ));
    }
    let n = parse_len(&text[1..], MAX_ARGS)?;
    let mut args = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        line.clear();
        r.read_until(b'\n', line)?;
        let head = trim_crlf(line);
        if head.first() != Some(&b'$') {
            return Err(bad("expected a bulk string"));
        }
        let len = parse_len(&head[1..], MAX_BULK)?;
        let mut arg = vec![0; len + 2];
        r.read_exact(&mut arg)?;
        arg.truncate(len);
        args.push(arg);
    }
    Ok(Some(args))
}

fn trim_crlf(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn parse_len(digits: &[u8], max: usize) -> io::Result<usize> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n <= max)
        .ok_or_else(|| bad("bad length"))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn bulk(out: &mut impl Write, value: Option<&[u8]>) -> io::Result<()> {
    match value {
        Some(v) => {
            write!(out, "${}\r\n", v.len())?;
            out.write_all(v)?;
            out.write_all(b"\r\n")
        }
        None => out.write_all(b"$-1\r\n"),
    }
}

/// Runs one command; whether the client asked to quit.
fn execute(args: &[Vec<u8>], store: &Store, out: &mut impl Write) -> io::Result<bool> {
    let Some(name) = args.first() else {
        return Ok(false);
    };
    let name = name.to_ascii_uppercase();
    let arity = |n: usize| args.len() == n;
    let lock = || store.lock().unwrap_or_else(|e| e.into_inner());
    match (name.as_slice(), args.len()) {
        (b"PING", 1) => out.write_all(b"+PONG\r\n")?,
        (b"PING", 2) | (b"ECHO", 2) => bulk(out, Some(&args[1]))?,
        (b"GET", 2) => {
            let map = lock();
            bulk(out, map.get(&args[1]).map(Vec::as_slice))?;
        }
        (b"SET", 3) => {
            lock().insert(args[1].clone(), args[2].clone());
            out.write_all(b"+OK\r\n")?;
        }
        (b"DEL", n) | (b"EXISTS", n) if n >= 2 => {
            let mut map = lock();
            let del = name.as_slice() == b"DEL";
            let count = args[1..]
                .iter()
                .filter(|k| {
                    if del {
                        map.remove(*k).is_some()
                    } else {
                        map.contains_key(*k)
                    }
                })
                .count();
            write!(out, ":{count}\r\n")?;
        }
        (b"INCR", 2) => {
            let mut map = lock();
            let now = map
                .get(&args[1])
                .map(|v| {
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                })
                .unwrap_or(Some(0));
            match now.and_then(|n| n.checked_add(1)) {
                Some(n) => {
                    map.insert(args[1].clone(), n.to_string().into_bytes());
                    write!(out, ":{n}\r\n")?;
                }
                None => out.write_all(b"-ERR value is not an integer or out of range\r\n")?,
            }
        }
        (b"DBSIZE", 1) => write!(out, ":{}\r\n", lock().len())?,
        (b"FLUSHALL", _) | (b"FLUSHDB", _) => {
            lock().clear();
            out.write_all(b"+OK\r\n")?;
        }
        (b"CONFIG", 3) if args[1].eq_ignore_ascii_case(b"GET") => {
            let key = &args[2];
            let value: Option<&[u8]> = match key.to_ascii_lowercase().as_slice() {
                b"save" => Some(b""),
                b"appendonly" => Some(b"no"),
                _ => None,
            };
            match value {
                Some(v) => {
                    out.write_all(b"*2\r\n")?;
                    bulk(out, Some(key))?;
                    bulk(out, Some(v))?;
                }
                None => out.write_all(b"*0\r\n")?,
            }
        }
        (b"COMMAND", _) => out.write_all(b"*0\r\n")?,
        (b"QUIT", _) => {
            out.write_all(b"+OK\r\n")?;
            return Ok(true);
        }
        _ if arity(0) => {}
        _ => {
            out.write_all(b"-ERR unknown command or wrong number of arguments for '")?;
            out.write_all(&args[0])?;
            out.write_all(b"'\r\n")?;
        }
    }
    Ok(false)
}
