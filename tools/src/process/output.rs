//! What a command tool keeps of a process's output: stdout's head, stderr's tail.

use std::fmt::Write as _;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The first `limit` bytes of a stream, and how long it was.
pub(crate) struct Head {
    pub(crate) kept: Vec<u8>,
    pub(crate) limit: usize,
    pub(crate) total: u64,
}

impl Head {
    pub(crate) fn new(limit: usize) -> Self {
        Head {
            kept: Vec::new(),
            limit,
            total: 0,
        }
    }

    /// Reads `pipe` to its end (or a read error), keeping the head and
    /// counting the rest.
    pub(crate) async fn fill(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            self.total += n as u64;
            let room = self.limit.saturating_sub(self.kept.len());
            self.kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }

    /// The kept bytes as text (lossy UTF-8), with a note when cut. A cut
    /// that splits a character ends before it.
    pub(crate) fn text(&self) -> String {
        if self.total <= self.kept.len() as u64 {
            return String::from_utf8_lossy(&self.kept).into_owned();
        }
        let shown = match std::str::from_utf8(&self.kept) {
            Err(e) if e.error_len().is_none() => &self.kept[..e.valid_up_to()],
            _ => &self.kept[..],
        };
        let mut text = String::from_utf8_lossy(shown).into_owned();
        let _ = write!(
            text,
            "\n[output cut: showed the first {} of {} bytes]",
            shown.len(),
            self.total
        );
        text
    }
}

/// The last `limit` bytes of a stream, and how long it was.
pub(crate) struct Tail {
    pub(crate) kept: Vec<u8>,
    pub(crate) limit: usize,
    pub(crate) total: u64,
}

impl Tail {
    pub(crate) fn new(limit: usize) -> Self {
        Tail {
            kept: Vec::new(),
            limit,
            total: 0,
        }
    }

    /// Reads `pipe` to its end (or a read error), keeping the tail.
    pub(crate) async fn fill(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = vec![0u8; 8 * 1024];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            self.total += n as u64;
            self.kept.extend_from_slice(&buf[..n]);
            // Trim in bulk, not on every read.
            if self.kept.len() > 2 * self.limit {
                self.kept.drain(..self.kept.len() - self.limit);
            }
        }
        if self.kept.len() > self.limit {
            self.kept.drain(..self.kept.len() - self.limit);
        }
    }

    /// The kept bytes as text (lossy UTF-8); a cut that splits a character
    /// starts after it.
    pub(crate) fn text(&self) -> String {
        let mut start = 0;
        if self.total > self.kept.len() as u64 {
            // Skip UTF-8 continuation bytes (0b10xx_xxxx) left by the cut.
            while start < self.kept.len().min(3) && self.kept[start] & 0xC0 == 0x80 {
                start += 1;
            }
        }
        String::from_utf8_lossy(&self.kept[start..]).into_owned()
    }
}
