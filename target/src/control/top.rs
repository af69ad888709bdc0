//! `pollux top`: a live terminal view of a running target, refreshed every second, on
//! ratatui (crossterm backend). `q` (or Esc, Ctrl-C) quits.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::{DefaultTerminal, Frame};
use serde_json::Value;

use super::cli::{SocketArgs, ns};
use super::view::{CtrlList, ReactorView, SubsystemView, VersionView};
use super::{Client, ControlError};

/// `pollux top` arguments.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The socket to use.
    #[command(flatten)]
    pub socket: SocketArgs,
    /// Refresh interval in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,
}

/// What one refresh fetched.
#[derive(Debug, Default)]
struct State {
    version: Option<VersionView>,
    reactors: Vec<ReactorView>,
    subsystems: Vec<SubsystemView>,
    ctrls: Option<CtrlList>,
    error: Option<String>,
}

fn fetch(path: &Path, client: &mut Option<Client>) -> State {
    let mut go = || -> Result<State, ControlError> {
        let c = match client {
            Some(c) => c,
            None => client.insert(Client::connect(path)?),
        };
        Ok(State {
            version: Some(c.call_as("version", Value::Null)?),
            reactors: c.call_as("reactors", Value::Null)?,
            subsystems: c.call_as("subsystems", Value::Null)?,
            ctrls: Some(c.call_as("controllers", Value::Null)?),
            error: None,
        })
    };
    match go() {
        Ok(s) => s,
        Err(e) => {
            *client = None;
            State {
                error: Some(e.to_string()),
                ..State::default()
            }
        }
    }
}

fn mode_style(mode: &str) -> Style {
    match mode {
        "poll" => Style::default().fg(Color::Red),
        "hybrid" => Style::default().fg(Color::Yellow),
        _ => Style::default().fg(Color::Green),
    }
}

fn draw(f: &mut Frame, path: &Path, s: &State) {
    let nr = s.reactors.len() as u16;
    let ns_rows = s.subsystems.len() as u16;
    let [title, reactors, subsystems, ctrls, help] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(nr + 3),
        Constraint::Length(ns_rows + 3),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let head = match (&s.version, &s.error) {
        (_, Some(e)) => Line::styled(
            format!("pollux top  {}  ERROR: {e}", path.display()),
            Style::default().fg(Color::Red),
        ),
        (Some(v), None) => Line::from(format!(
            "pollux {}  {}  up {:.0}s  reactors {}  pid {}",
            v.version,
            path.display(),
            v.uptime_s,
            v.reactors,
            v.pid
        )),
        (None, None) => Line::from("pollux top: connecting..."),
    };
    f.render_widget(Paragraph::new(head), title);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = s.reactors.iter().map(|r| {
        Row::new(vec![
            ratatui::text::Span::raw(r.id.to_string()),
            ratatui::text::Span::raw(r.core.map_or("-".into(), |c| c.to_string())),
            // "held": an `always` namespace keeps it in busy-poll whatever its mode.
            ratatui::text::Span::styled(
                if r.held {
                    format!("{} held", r.mode)
                } else {
                    r.mode.clone()
                },
                mode_style(if r.held { "poll" } else { &r.mode }),
            ),
            ratatui::text::Span::raw(if r.adaptive { "adaptive" } else { "fixed" }),
            ratatui::text::Span::raw(format!("{:.1}", r.cpu_pct_1s)),
            ratatui::text::Span::raw(format!("{:.1}", r.busy_pct)),
            ratatui::text::Span::raw(format!("{:.0}", r.iops)),
            ratatui::text::Span::raw(ns(r.predicted_ns)),
            ratatui::text::Span::raw(r.switches.to_string()),
            ratatui::text::Span::raw(r.outstanding.to_string()),
            ratatui::text::Span::raw(r.connections.to_string()),
            ratatui::text::Span::raw(r.admin_queues.to_string()),
            ratatui::text::Span::raw(r.stalls.to_string()),
        ])
    });
    let t = Table::new(
        rows,
        [
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Length(15),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(6),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Length(7),
        ],
    )
    .header(
        Row::new([
            "REACTOR", "CORE", "MODE", "POLICY", "CPU%", "BUSY%", "IOPS", "LATENCY", "SWITCHES", "OUTST", "QUEUES",
            "CTRLS", "STALLS",
        ])
        .style(bold),
    )
    .block(Block::bordered().title("Reactors"));
    f.render_widget(t, reactors);
    let rows = s.subsystems.iter().map(|x| {
        let (r, w) = x
            .namespaces
            .iter()
            .fold((0, 0), |(r, w), n| (r + n.read_cmds, w + n.write_cmds));
        // The paths whose ANA states are not all optimized (`subsystems` lists them so).
        let ana: Vec<&str> = x
            .listeners
            .iter()
            .filter(|l| l.contains(" ana "))
            .map(String::as_str)
            .collect();
        // Each namespace's polling policy that is not `auto`, as nsid:policy.
        let polling: Vec<String> = x
            .namespaces
            .iter()
            .filter(|n| !n.polling.is_empty() && n.polling != "auto")
            .map(|n| format!("{}:{}", n.nsid, n.polling))
            .collect();
        Row::new(vec![
            x.nqn.clone(),
            x.namespaces.len().to_string(),
            x.controllers.to_string(),
            r.to_string(),
            w.to_string(),
            if polling.is_empty() {
                "auto".into()
            } else {
                polling.join(" ")
            },
            if ana.is_empty() {
                "all optimized".into()
            } else {
                ana.join("; ")
            },
        ])
    });
    let t = Table::new(
        rows,
        [
            Constraint::Min(30),
            Constraint::Length(10),
            Constraint::Length(11),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(18),
            Constraint::Min(20),
        ],
    )
    .header(
        Row::new([
            "SUBSYSTEM",
            "NAMESPACES",
            "CONTROLLERS",
            "READS",
            "WRITES",
            "POLLING",
            "ANA",
        ])
        .style(bold),
    )
    .block(Block::bordered().title("Subsystems"));
    f.render_widget(t, subsystems);
    let list = s.ctrls.as_ref().map(|c| c.controllers.as_slice()).unwrap_or_default();
    let rows = list.iter().map(|c| {
        let q: Vec<String> = c.io_queues.iter().map(|(q, r)| format!("{q}:{r}")).collect();
        Row::new(vec![
            c.cntlid.to_string(),
            c.subsystem.clone(),
            c.hostnqn.clone(),
            c.admin_reactor.to_string(),
            q.join(","),
        ])
    });
    let t = Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Min(20),
            Constraint::Min(20),
            Constraint::Length(5),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(["CNTLID", "SUBSYSTEM", "HOST", "ADMIN", "IO QUEUES (qid:reactor)"]).style(bold))
    .block(Block::bordered().title(format!("Controllers ({})", list.len())));
    f.render_widget(t, ctrls);
    f.render_widget(Paragraph::new("q: quit"), help);
}

fn run(term: &mut DefaultTerminal, path: &Path, every: Duration) -> std::io::Result<()> {
    let mut client = None;
    let mut state = fetch(path, &mut client);
    let mut last = Instant::now();
    loop {
        term.draw(|f| draw(f, path, &state))?;
        let wait = every.saturating_sub(last.elapsed());
        if event::poll(wait)?
            && let Event::Key(k) = event::read()?
            && k.kind == KeyEventKind::Press
        {
            match k.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                _ => {}
            }
        }
        if last.elapsed() >= every {
            state = fetch(path, &mut client);
            last = Instant::now();
        }
    }
}

/// `pollux top`: 0 when quit, 1 if the terminal could not be used.
pub fn main(args: &TopArgs) -> ExitCode {
    let path: PathBuf = match args.socket.resolve() {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "pollux top: {e}");
            return ExitCode::from(2);
        }
    };
    let mut term = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "pollux top: cannot use the terminal: {e}");
            return ExitCode::from(1);
        }
    };
    let res = run(&mut term, &path, Duration::from_millis(args.interval_ms.max(100)));
    ratatui::restore();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "pollux top: {e}");
            ExitCode::from(1)
        }
    }
}
