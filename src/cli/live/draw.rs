//! The live view on the terminal: an inline area under the scrolling log,
//! redrawn in place ([`Screen`]), and the keys read from the terminal
//! ([`Input`]).

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::termios::{self, LocalModes, OptionalActions, Termios};

/// The live area at the bottom of the terminal (stderr) and the log lines
/// printed above it.
pub struct Screen {
    /// Lines of the live area now on the screen.
    drawn: usize,
    /// Colours and inverse video, unless `NO_COLOR` says no.
    pub color: bool,
}

impl Screen {
    /// A screen on stderr.
    pub fn new() -> Self {
        Screen {
            drawn: 0,
            color: super::super::colour(&std::io::stderr()),
        }
    }

    /// The terminal's size now (rows, columns): read on every frame, so a
    /// resized terminal is drawn to its new size.
    pub fn size() -> (usize, usize) {
        let (rows, cols) = console::Term::stderr().size();
        (usize::from(rows).max(3), usize::from(cols).max(20))
    }

    /// Erases the live area, prints `log` (lines that stay, scrolling up),
    /// then draws `live` in place, each line cut to the width so none
    /// wraps (a wrapped line would throw the next frame's erase off).
    pub fn frame(&mut self, log: &[String], live: &[String], width: usize) {
        let mut out = String::new();
        self.erase_into(&mut out);
        for line in log {
            out.push_str(line);
            out.push('\n');
        }
        for line in live {
            let cut = console::truncate_str(line, width.saturating_sub(1), "…");
            out.push_str(&cut);
            out.push_str("\x1b[K\n");
        }
        self.drawn = live.len();
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(out.as_bytes());
        let _ = err.flush();
    }

    /// Erases the live area (before a question, and at the end).
    pub fn clear(&mut self) {
        let mut out = String::new();
        self.erase_into(&mut out);
        self.drawn = 0;
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(out.as_bytes());
        let _ = err.flush();
    }

    fn erase_into(&self, out: &mut String) {
        if self.drawn > 0 {
            out.push_str(&format!("\r\x1b[{}A\x1b[J", self.drawn));
        }
    }
}

/// A key the view acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Up arrow or `k`.
    Up,
    /// Down arrow or `j`.
    Down,
    /// Enter or space: fold or unfold the selected subtree.
    Toggle,
    /// `c`: cancel the selected run (the tree when it is the root).
    Cancel,
}

/// Reads the terminal's keys on a thread of its own, with the terminal out
/// of line mode (no echo, keys as they are pressed; Ctrl-C still a signal,
/// output unchanged) while the view is drawn, and back in line mode while a
/// question is asked ([`Input::ask`]) so that the person types an answer as
/// usual. The terminal's modes are put back when the input is dropped.
pub struct Input {
    stop: Arc<AtomicBool>,
    asking: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Input {
    /// Starts reading stdin (a terminal): keys go to `keys`, and while a
    /// question is asked, whole lines to `lines`.
    pub fn start(
        keys: tokio::sync::mpsc::UnboundedSender<Key>,
        lines: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Option<Self> {
        let stdin = std::io::stdin();
        let original = termios::tcgetattr(stdin.as_fd()).ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let asking = Arc::new(AtomicBool::new(false));
        let (stop2, asking2) = (stop.clone(), asking.clone());
        let thread = std::thread::Builder::new()
            .name("arbor-keys".into())
            .spawn(move || read_keys(original, &stop2, &asking2, &keys, &lines))
            .ok()?;
        Some(Input {
            stop,
            asking,
            thread: Some(thread),
        })
    }

    /// While `on`, the terminal is in line mode and lines are read whole.
    pub fn ask(&self, on: bool) {
        self.asking.store(on, Ordering::SeqCst);
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The terminal without line mode and echo (signals and output as they
/// were).
fn keys_mode(original: &Termios) -> Termios {
    let mut raw = original.clone();
    raw.local_modes
        .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ECHONL);
    raw.special_codes[termios::SpecialCodeIndex::VMIN] = 1;
    raw.special_codes[termios::SpecialCodeIndex::VTIME] = 0;
    raw
}

fn read_keys(
    original: Termios,
    stop: &AtomicBool,
    asking: &AtomicBool,
    keys: &tokio::sync::mpsc::UnboundedSender<Key>,
    lines: &tokio::sync::mpsc::UnboundedSender<String>,
) {
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let raw = keys_mode(&original);
    let mut in_keys = false;
    let mut pending: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let want_keys = !asking.load(Ordering::SeqCst);
        if want_keys != in_keys {
            let mode = if want_keys { &raw } else { &original };
            if termios::tcsetattr(fd, OptionalActions::Now, mode).is_err() {
                break;
            }
            in_keys = want_keys;
            pending.clear();
        }
        let mut polled = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        match rustix::event::poll(&mut polled, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        let mut buf = [0u8; 256];
        let n = match rustix::io::read(fd, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if in_keys {
            pending.extend_from_slice(&buf[..n]);
            for key in parse_keys(&mut pending) {
                let _ = keys.send(key);
            }
        } else {
            for &b in &buf[..n] {
                if b == b'\n' {
                    let _ = lines.send(String::from_utf8_lossy(&line).into_owned());
                    line.clear();
                } else {
                    line.push(b);
                }
            }
        }
    }
    let _ = termios::tcsetattr(fd, OptionalActions::Now, &original);
    // Give a last answer a moment to be read before the thread ends.
    std::thread::sleep(Duration::from_millis(1));
}

/// The keys in `bytes` (what is left, an escape sequence cut short, stays).
fn parse_keys(bytes: &mut Vec<u8>) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            0x1b => {
                if bytes.len() < i + 3 {
                    break;
                }
                if bytes[i + 1] == b'[' || bytes[i + 1] == b'O' {
                    match bytes[i + 2] {
                        b'A' => keys.push(Key::Up),
                        b'B' => keys.push(Key::Down),
                        _ => {}
                    }
                    i += 3;
                } else {
                    i += 1;
                }
                continue;
            }
            b'k' => keys.push(Key::Up),
            b'j' => keys.push(Key::Down),
            b'\r' | b'\n' | b' ' => keys.push(Key::Toggle),
            b'c' => keys.push(Key::Cancel),
            _ => {}
        }
        i += 1;
    }
    bytes.drain(..i);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrows_letters_and_a_cut_escape_sequence_become_keys() {
        let mut bytes = b"\x1b[Ajk c\r\x1b[B\x1b[".to_vec();
        assert_eq!(
            parse_keys(&mut bytes),
            [
                Key::Up,
                Key::Down,
                Key::Up,
                Key::Toggle,
                Key::Cancel,
                Key::Toggle,
                Key::Down
            ]
        );
        assert_eq!(bytes, b"\x1b[", "kept for the next read");
        bytes.push(b'B');
        assert_eq!(parse_keys(&mut bytes), [Key::Down]);
        assert!(bytes.is_empty());
    }
}
