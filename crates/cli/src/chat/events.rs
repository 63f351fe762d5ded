//! Everything the chat waits for, on one channel: typed lines, Ctrl-C, and the engine's
//! deltas. One channel lets the chat loop block on a single `recv` whether it sits at the
//! prompt or streams an answer (std channels have no `select`).

use anyhow::{Context, Result};
use deepinfer_engine::request::{OutputSink, RequestOutput};
use std::io::BufRead;
use std::sync::mpsc::{self, Receiver, Sender};

pub(super) enum Event {
    /// A line of input, without its line ending.
    Line(String),
    /// End of input (Ctrl-D at the start of a line, or the end of a pipe).
    Eof,
    /// Ctrl-C (SIGINT).
    Interrupt,
    /// A delta of the answer numbered `turn`.
    Output(u64, Box<RequestOutput>),
    /// The engine let go of answer `turn`'s sink: after its last delta when all is well,
    /// without one when the engine stopped.
    Closed(u64),
}

/// Starts the stdin reader and the Ctrl-C listener. From here on SIGINT no longer ends the
/// process: the chat decides what it means.
pub(super) fn start() -> Result<(Sender<Event>, Receiver<Event>)> {
    let (tx, rx) = mpsc::channel();
    listen_for_interrupts(tx.clone())?;
    let lines = tx.clone();
    std::thread::Builder::new()
        .name("chat-stdin".into())
        .spawn(move || read_lines(lines))
        .context("starting the input thread")?;
    Ok((tx, rx))
}

/// Sends each line of stdin, then [`Event::Eof`]. Bytes that are not UTF-8 are replaced
/// rather than ending the chat.
fn read_lines(tx: Sender<Event>) {
    let stdin = std::io::stdin();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match stdin.lock().read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.strip_suffix('\n').unwrap_or(&line);
                let line = line.strip_suffix('\r').unwrap_or(line);
                if tx.send(Event::Line(line.to_string())).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = tx.send(Event::Eof);
}

/// A thread with a small async runtime turns each SIGINT into [`Event::Interrupt`]. Returns
/// once the handler is installed, so no Ctrl-C after the first prompt can end the process.
fn listen_for_interrupts(tx: Sender<Event>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("chat-ctrl-c".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                // `signal` installs the handler now; `ctrl_c()` would only on its first poll.
                let mut sigint = match signal(SignalKind::interrupt()) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while sigint.recv().await.is_some() {
                    if tx.send(Event::Interrupt).is_err() {
                        return;
                    }
                }
            })
        })
        .context("starting the Ctrl-C thread")?;
    ready_rx
        .recv()
        .context("the Ctrl-C thread ended")?
        .context("listening for Ctrl-C")
}

/// The engine's side of one answer: its deltas go onto the event channel, tagged with the
/// answer's number so a late event of an earlier answer is never taken for this one's.
pub(super) struct EventSink {
    pub turn: u64,
    pub tx: Sender<Event>,
}

impl OutputSink for EventSink {
    fn send(&mut self, out: RequestOutput) -> bool {
        self.tx
            .send(Event::Output(self.turn, Box::new(out)))
            .is_ok()
    }
}

impl Drop for EventSink {
    fn drop(&mut self) {
        let _ = self.tx.send(Event::Closed(self.turn));
    }
}
