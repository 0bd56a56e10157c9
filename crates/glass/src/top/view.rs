//! The view thread of `glass top`: it takes the recorder's records off the channel,
//! keeps the [`Live`] model, and every interval shows the window's table, either drawn
//! with ratatui (crossterm backend) on the alternate screen with keys to change it (read
//! by [`Keyboard`]), or
//! printed as text (`--batch`).

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use ratatui::layout::{Alignment, Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table as TableWidget};
use ratatui::DefaultTerminal;

use super::live::{Live, Message, SortKey, Table, ThreadView};

/// What the user asked for.
pub struct Settings {
    /// The target as the header names it.
    pub target: String,
    /// The header adds the target's pid (a command glass launched).
    pub show_pid: bool,
    pub window: Duration,
    pub interval: Duration,
    pub frequency: u32,
    /// Rows per table in batch mode (the screen shows what fits).
    pub limit: usize,
    /// Start split by thread.
    pub threads: bool,
    pub batch: bool,
}

/// What the view and the recording thread share.
#[derive(Default)]
pub struct Shared {
    /// The user quit while the recording ran (the view ended it).
    pub quit: AtomicBool,
    /// The view has seen the recording end.
    pub ended: AtomicBool,
    /// The target's pid, once the recording knows it.
    pub target_pid: Arc<AtomicU32>,
}

/// Ends the recording when the view goes away before it (the user quit, or the view
/// failed): SIGINT to glass itself, which every thread blocks, so the recording loop
/// reads it and ends as on Ctrl-C under `glass record`.
struct EndRecordingOnExit<'a>(&'a Shared);

impl Drop for EndRecordingOnExit<'_> {
    fn drop(&mut self) {
        if !self.0.ended.load(Ordering::SeqCst) {
            self.0.quit.store(true, Ordering::SeqCst);
            // SAFETY: sends a signal to this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
        }
    }
}

/// The view's state besides the model.
struct State {
    live: Live,
    view: ThreadView,
    sort: SortKey,
    paused: bool,
    /// Why the recording ended, once it has.
    ended: Option<String>,
    /// Notes to print after the screen closes.
    notes: Vec<String>,
    last_warning: Option<String>,
}

impl State {
    fn new(settings: &Settings) -> Self {
        State {
            live: Live::new(settings.window.as_nanos() as u64),
            view: if settings.threads {
                ThreadView::Split
            } else {
                ThreadView::All
            },
            sort: SortKey::SelfShare,
            paused: false,
            ended: None,
            notes: Vec::new(),
            last_warning: None,
        }
    }

    /// Takes one message; notes are printed at once when `print_notes`.
    fn take(&mut self, message: Message, print_notes: bool, shared: &Shared) {
        match message {
            Message::Note { warning, text } => {
                let line = super::live::note_line(warning, &text);
                if print_notes {
                    eprintln!("{line}");
                } else {
                    self.notes.push(line);
                }
                if warning {
                    self.last_warning = Some(text);
                }
            }
            Message::Ended { text, .. } => {
                shared.ended.store(true, Ordering::SeqCst);
                self.live.end();
                self.ended = Some(text);
            }
            other => self.live.handle(other),
        }
    }

    /// `t`: all threads, split by thread, then each thread alone, then all again.
    fn next_thread_view(&mut self) {
        let threads = self.live.threads();
        self.view = match self.view {
            ThreadView::All => ThreadView::Split,
            ThreadView::Split => threads
                .first()
                .map_or(ThreadView::All, |&t| ThreadView::One(t)),
            ThreadView::One(current) => threads
                .iter()
                .find(|&&t| t > current)
                .map_or(ThreadView::All, |&t| ThreadView::One(t)),
        };
    }

    fn view_name(&self) -> String {
        match self.view {
            ThreadView::All => "all threads".to_string(),
            ThreadView::Split => "split by thread".to_string(),
            ThreadView::One(tid) => format!("thread {}", self.live.thread_label(tid)),
        }
    }
}

/// The view thread's body. Returns the channel (notes the recording sends after the
/// view closed are printed by the caller) and the notes kept while the screen was up.
pub fn run(
    messages: Receiver<Message>,
    settings: &Settings,
    shared: &Shared,
) -> (Receiver<Message>, Vec<String>) {
    let _end = EndRecordingOnExit(shared);
    let mut state = State::new(settings);
    if settings.batch {
        batch(&messages, settings, shared, &mut state);
        return (messages, Vec::new());
    }
    // Until the recording starts (a VM may take seconds to boot), notes go to stderr and
    // no screen is drawn: a target that cannot be started is one line, as for record.
    loop {
        match messages.recv() {
            Ok(Message::Meta(meta)) => {
                state.live.handle(Message::Meta(meta));
                break;
            }
            Ok(message) => {
                state.take(message, true, shared);
                if state.ended.is_some() {
                    return (messages, Vec::new());
                }
            }
            Err(_) => return (messages, Vec::new()),
        }
    }
    let mut terminal = match ratatui::try_init() {
        Ok(terminal) => terminal,
        Err(error) => {
            ratatui::restore();
            eprintln!(
                "glass: warning: cannot draw the view: {}",
                glass_record::error_text(&error)
            );
            return (messages, Vec::new());
        }
    };
    let result = interactive(&mut terminal, &messages, settings, shared, &mut state);
    ratatui::restore();
    if let Err(error) = result {
        state.notes.push(format!(
            "glass: warning: the view failed: {}",
            glass_record::error_text(&error)
        ));
    }
    (messages, state.notes)
}

/// The most messages taken between two looks at the keyboard.
const MESSAGES_PER_TURN: usize = 4096;

fn interactive(
    terminal: &mut DefaultTerminal,
    messages: &Receiver<Message>,
    settings: &Settings,
    shared: &Shared,
    state: &mut State,
) -> io::Result<()> {
    let keyboard = Keyboard::open()?;
    let mut next_refresh = Instant::now() + settings.interval;
    let mut redraw = true;
    let mut size = terminal.size()?;
    loop {
        // Take what arrived (bounded, so that keys are still read under a flood).
        for _ in 0..MESSAGES_PER_TURN {
            match messages.try_recv() {
                Ok(message) => {
                    let ended = matches!(message, Message::Ended { linger: false, .. });
                    state.take(message, false, shared);
                    if ended {
                        return Ok(());
                    }
                    redraw |= state.ended.is_some();
                }
                Err(_) => break,
            }
        }
        if state.ended.is_some() && stop_signal_taken() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= next_refresh {
            next_refresh = now + settings.interval;
            redraw = true;
        }
        // A resized terminal is drawn anew at once (no SIGWINCH handler: it would run
        // on the sampling thread).
        let new_size = terminal.size()?;
        redraw |= new_size != size;
        size = new_size;
        if redraw {
            let table = state.live.table(state.view, state.sort);
            terminal.draw(|frame| draw(frame, settings, state, &table))?;
            redraw = false;
        }
        let wait = next_refresh
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        let Some(keys) = keyboard.read(wait) else {
            // The terminal went away.
            return Ok(());
        };
        for key in keys {
            match key {
                b'q' | ESCAPE | CONTROL_C => return Ok(()),
                CONTROL_L => terminal.clear()?,
                b's' | b'1' => state.sort = SortKey::SelfShare,
                b'T' | b'2' => state.sort = SortKey::Total,
                b'n' | b'3' => state.sort = SortKey::Name,
                b't' => state.next_thread_view(),
                b' ' => {
                    state.paused = !state.paused;
                    match state.paused {
                        true => state.live.freeze(),
                        false => state.live.thaw(),
                    }
                }
                _ => continue,
            }
            // A key shows its effect at once.
            redraw = true;
        }
    }
}

const ESCAPE: u8 = 0x1b;
const CONTROL_C: u8 = 0x03;
const CONTROL_L: u8 = 0x0c;

/// The keys, read from the terminal in raw mode as bytes. Not crossterm's event reader:
/// once the terminal is gone (its window closed, tmux killed) that reader re-reads the
/// dead descriptor forever and never returns, even with a timeout (crossterm issue
/// #793, in 0.28 and 0.29), which would leave glass spinning and the target sampled;
/// and its SIGWINCH handler would interrupt the sampling thread. The view needs only
/// single-byte keys.
struct Keyboard {
    fd: std::os::fd::OwnedFd,
}

impl Keyboard {
    /// The terminal crossterm put in raw mode: standard input if it is one, else
    /// /dev/tty (as crossterm chooses).
    fn open() -> io::Result<Keyboard> {
        use std::os::fd::AsFd;
        let fd = match io::stdin().is_terminal() {
            true => io::stdin().as_fd().try_clone_to_owned()?,
            false => std::fs::File::open("/dev/tty")?.into(),
        };
        Ok(Keyboard { fd })
    }

    /// The keys pressed within `timeout` (escape sequences, such as arrow keys, left
    /// out); None once the terminal has hung up.
    fn read(&self, timeout: Duration) -> Option<Vec<u8>> {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout.as_millis() as libc::c_int) };
        if ready <= 0 {
            return Some(Vec::new());
        }
        if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return None;
        }
        let mut buffer = [0u8; 64];
        // SAFETY: reads into our buffer.
        let n = unsafe { libc::read(poll.fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if n == 0 {
            return None;
        }
        if n < 0 {
            let error = io::Error::last_os_error();
            return match error.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Some(Vec::new()),
                _ => None,
            };
        }
        Some(keys_of(&buffer[..n as usize]))
    }
}

/// The single-byte keys in what the terminal sent, without its escape sequences (arrow
/// and function keys: `ESC [ ... final`, `ESC O x`; Alt with a key: `ESC x`). An escape
/// that ends the read is the Esc key itself.
fn keys_of(bytes: &[u8]) -> Vec<u8> {
    let mut keys = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != ESCAPE {
            keys.push(bytes[at]);
            at += 1;
            continue;
        }
        match bytes.get(at + 1) {
            None => {
                keys.push(ESCAPE);
                at += 1;
            }
            Some(b'[') => {
                // Parameters and intermediates, then one final byte.
                at += 2;
                while at < bytes.len() && !(0x40..=0x7e).contains(&bytes[at]) {
                    at += 1;
                }
                at += 1;
            }
            Some(b'O') => at += 3,
            Some(_) => at += 2,
        }
    }
    keys
}

/// Once the recording has ended nothing reads the stop signals (every thread blocks
/// them): the lingering view takes them itself. SIGHUP is how it learns that its
/// terminal went away; SIGINT and SIGTERM still end glass.
fn stop_signal_taken() -> bool {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid set and timeout; no siginfo wanted.
    unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &zero) > 0 }
}

fn draw(frame: &mut ratatui::Frame, settings: &Settings, state: &State, table: &Table) {
    let mut header: Vec<Line> = header_lines(settings, state, table)
        .into_iter()
        .map(Line::from)
        .collect();
    let status = match (&state.ended, &state.last_warning) {
        (Some(ended), _) => format!("recording ended: {ended}; press q to quit"),
        (None, Some(warning)) => format!("warning: {warning}"),
        (None, None) => String::new(),
    };
    header.push(Line::from(status).style(Style::default().add_modifier(Modifier::BOLD)));
    let [top, rest] =
        Layout::vertical([Constraint::Length(header.len() as u16), Constraint::Min(0)])
            .areas(frame.area());
    frame.render_widget(Paragraph::new(header), top);
    let split = state.view == ThreadView::Split;
    let names = column_names(split);
    let widths: Vec<Constraint> = names
        .iter()
        .map(|name| match *name {
            "FUNCTION" => Constraint::Fill(3),
            "MODULE" => Constraint::Fill(1),
            "THREAD" => Constraint::Length(20),
            _ => Constraint::Length(7),
        })
        .collect();
    // The counts right-aligned, under right-aligned titles.
    let cell = |index: usize, text: String| match index < 4 {
        true => Cell::from(Line::from(text).alignment(Alignment::Right)),
        false => Cell::from(text),
    };
    let rows = table
        .rows
        .iter()
        .take(rest.height.saturating_sub(1) as usize)
        .map(|row| {
            TableRow::new(
                cells(state, table, row)
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| cell(i, text)),
            )
        });
    let titles = names
        .iter()
        .enumerate()
        .map(|(i, n)| cell(i, n.to_string()));
    let widget = TableWidget::new(rows, widths)
        .header(TableRow::new(titles).style(Style::default().add_modifier(Modifier::REVERSED)))
        .column_spacing(1);
    frame.render_widget(widget, rest);
}

fn column_names(split: bool) -> Vec<&'static str> {
    let mut names = vec!["SELF%", "TOTAL%", "SELF", "TOTAL"];
    if split {
        names.push("THREAD");
    }
    names.extend(["FUNCTION", "MODULE"]);
    names
}

fn cells(state: &State, table: &Table, row: &super::live::Row) -> Vec<String> {
    let share = |n: u64| {
        if table.samples == 0 {
            0.0
        } else {
            n as f64 * 100.0 / table.samples as f64
        }
    };
    let function = &state.live.functions[row.function as usize];
    let mut cells = vec![
        format!("{:6.2}", share(row.self_samples)),
        format!("{:6.2}", share(row.total_samples)),
        row.self_samples.to_string(),
        row.total_samples.to_string(),
    ];
    if let Some(tid) = row.thread.filter(|_| state.view == ThreadView::Split) {
        cells.push(state.live.thread_label(tid));
    }
    cells.push(function.name.clone());
    cells.push(function.module.clone());
    cells
}

/// The lines above the table: the target and rate, the sampler's cost, the keys.
fn header_lines(settings: &Settings, state: &State, table: &Table) -> Vec<String> {
    let backend = state
        .live
        .meta
        .as_ref()
        .map_or("-".to_string(), |m| m.backend.name().to_string());
    let seconds = settings.window.as_secs_f64();
    let pid = match &state.live.meta {
        Some(meta) if settings.show_pid && meta.target_pid > 0 => {
            format!(" (pid {})", meta.target_pid)
        }
        _ => String::new(),
    };
    let first = format!(
        "glass top: {}{pid} | {backend} backend, {} Hz | last {seconds} s: {} samples{}",
        settings.target,
        settings.frequency,
        table.window_samples,
        if state.paused { " | PAUSED" } else { "" },
    );
    let us = |ns: u64| ns as f64 / 1000.0;
    let cost = if state.live.is_perf() {
        format!(
            "target stopped per sample: 0 us (perf: the kernel copies the stack) | lost samples {}",
            table.lost
        )
    } else {
        let overhead = if table.span_ns > 0 {
            table.stopped_total_ns as f64 * 100.0 / table.span_ns as f64
        } else {
            0.0
        };
        format!(
            "target stopped per sample: mean {:.1} us, max {:.1} us, overhead {overhead:.2}% | missed {}, lost {}",
            us(table.stopped_mean_ns),
            us(table.stopped_max_ns),
            table.missed_deadlines,
            table.lost
        )
    };
    let mut lines = vec![first, cost];
    if !settings.batch {
        lines.push(format!(
            "view: {} ({} samples), sort: {} | keys: s T n sort, t threads, space pause, q quit",
            state.view_name(),
            table.samples,
            state.sort.name()
        ));
    }
    lines
}

/// `--batch`: the table as text every interval, and once more at the end.
fn batch(messages: &Receiver<Message>, settings: &Settings, shared: &Shared, state: &mut State) {
    let mut next_print: Option<Instant> = None;
    loop {
        let wait = next_print.map_or(Duration::from_millis(500), |at| {
            at.saturating_duration_since(Instant::now())
        });
        let message = match messages.recv_timeout(wait) {
            Ok(message) => Some(message),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if let Some(message) = message {
            let started = matches!(message, Message::Meta(_));
            state.take(message, true, shared);
            if started {
                next_print = Some(Instant::now() + settings.interval);
            }
            if let Some(ended) = state.ended.clone() {
                if state.live.meta.is_some() && print_table(settings, state).is_ok() {
                    println!("recording ended: {ended}");
                }
                return;
            }
        }
        if next_print.is_some_and(|at| Instant::now() >= at) {
            next_print = Some(Instant::now() + settings.interval);
            if print_table(settings, state).is_err() {
                // The reader went away: end the recording (by the guard).
                return;
            }
        }
    }
}

fn print_table(settings: &Settings, state: &mut State) -> io::Result<()> {
    let table = state.live.table(state.view, state.sort);
    let mut out = io::stdout().lock();
    for line in header_lines(settings, state, &table) {
        writeln!(out, "{line}")?;
    }
    let split = state.view == ThreadView::Split;
    let rows: Vec<Vec<String>> = table
        .rows
        .iter()
        .take(settings.limit)
        .map(|row| cells(state, &table, row))
        .collect();
    let names = column_names(split);
    // Columns as wide as their widest cell; the last (module) is not padded.
    let mut widths: Vec<usize> = names.iter().map(|n| n.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: &[String]| {
        let last = cells.len() - 1;
        cells
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i < 4 {
                    format!("{cell:>w$}", w = widths[i])
                } else if i < last {
                    format!("{cell:<w$}", w = widths[i])
                } else {
                    cell.clone()
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    writeln!(out, "{}", line(&names))?;
    for row in &rows {
        writeln!(out, "{}", line(row))?;
    }
    writeln!(out)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_leave_out_escape_sequences() {
        assert_eq!(keys_of(b"q"), b"q");
        assert_eq!(keys_of(b"\x1b"), [ESCAPE]);
        assert_eq!(keys_of(b"\x1b[A\x1b[Bq"), b"q");
        assert_eq!(keys_of(b"s\x1b[1;5Cn\x1bOPt \x1bx"), b"snt ");
        assert_eq!(keys_of(b"\x1b[15~T"), b"T");
        // A sequence cut by the end of the read is dropped, never taken as keys.
        assert_eq!(keys_of(b"\x1b[1;"), b"");
        assert_eq!(keys_of(b"\x03"), [CONTROL_C]);
    }
}
