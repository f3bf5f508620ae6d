//! Subscriber mode (`--ticks`): counts the notifications subscriptions deliver.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use serde::Serialize;

use super::drivers::{connect, ws_frame, ws_header};
use super::plan::{Plan, Transport};
use super::Args;

/// The subscriber mode's summary.
#[derive(Serialize)]
pub(crate) struct Subscribed<'a> {
    pub(crate) transport: &'static str,
    pub(crate) connections: usize,
    pub(crate) interval_ms: f64,
    pub(crate) duration_s: f64,
    /// Connections whose subscribe call was answered with a result.
    pub(crate) subscribed: usize,
    /// `tick` notifications read during the measured time.
    pub(crate) notifications: u64,
    pub(crate) notifications_per_s: f64,
    /// Ticks a server said it dropped (`lagged` notifications), measured time.
    pub(crate) dropped: u64,
    /// Error answers and broken connections.
    pub(crate) errors: u64,
    pub(crate) target: &'a str,
}

/// Subscriber mode: connects, subscribes each connection to `subscribe_ticks [ms]`, and
/// counts what arrives (one thread, one poll).
pub(crate) fn subscribers(args: &Args, plan: &Plan, ms: f64) -> Result<bool, String> {
    let run = || -> io::Result<Subscribed<'_>> {
        let mut poll = Poll::new()?;
        let mut conns = Vec::new();
        let message = |i: usize| {
            let interval = if args.ticks_distinct {
                // A distinct text, the same interval (1e-12 ms apart at most 1e-9).
                format!("{:.12}", ms + i as f64 * 1e-12)
            } else {
                format!("{ms}")
            };
            let request = format!(
                r#"{{"jsonrpc":"2.0","method":"subscribe_ticks","params":[{interval}],"id":1}}"#
            );
            let mut message = match plan.transport {
                Transport::Ws => ws_header(request.len()),
                _ => Vec::new(),
            };
            message.extend_from_slice(request.as_bytes());
            if plan.transport.lines() {
                message.push(b'\n');
            }
            message
        };
        for i in 0..args.connections {
            let mut s = connect(plan)?;
            poll.registry()
                .register(&mut s, Token(i), Interest::READABLE)?;
            conns.push((s, Vec::<u8>::with_capacity(64 * 1024), false));
        }
        // Every connection made first, then all subscribe at once: no subscription
        // runs up a backlog while the others connect.
        for (i, (s, _, _)) in conns.iter_mut().enumerate() {
            // A few dozen bytes into an empty socket buffer: written at once.
            s.write_all(&message(i))?;
        }
        let start = Instant::now();
        let measure_from = start + Duration::from_secs_f64(args.warmup);
        let end = measure_from + Duration::from_secs_f64(args.duration.unwrap_or(10.0));
        let (mut notifications, mut dropped, mut errors) = (0u64, 0u64, 0u64);
        let mut events = Events::with_capacity(1024);
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            poll.poll(&mut events, Some(end - now))?;
            let measured = Instant::now() >= measure_from;
            for ev in &events {
                let (s, buf, subscribed) = &mut conns[ev.token().0];
                loop {
                    match s.read(&mut chunk) {
                        Ok(0) => {
                            errors += 1;
                            break;
                        }
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            errors += 1;
                            break;
                        }
                    }
                }
                let mut at = 0;
                loop {
                    let frame = match plan.transport {
                        Transport::Ws => match ws_frame(&buf[at..]) {
                            Some((_, head, len)) if at + head + len <= buf.len() => {
                                let f = at + head..at + head + len;
                                at += head + len;
                                f
                            }
                            _ => break,
                        },
                        _ => match memchr::memchr(b'\n', &buf[at..]) {
                            Some(nl) => {
                                let f = at..at + nl;
                                at += nl + 1;
                                f
                            }
                            None => break,
                        },
                    };
                    let f = &buf[frame];
                    if memchr::memmem::find(f, br#""method":"tick""#).is_some() {
                        if let Some(i) = memchr::memmem::find(f, br#""lagged":"#) {
                            let digits = &f[i + 9..];
                            let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
                            let lost: u64 = std::str::from_utf8(&digits[..n])
                                .ok()
                                .and_then(|d| d.parse().ok())
                                .unwrap_or(0);
                            if measured {
                                dropped += lost;
                            }
                        } else if measured {
                            notifications += 1;
                        }
                    } else if memchr::memmem::find(f, br#""result""#).is_some() {
                        *subscribed = true;
                    } else {
                        errors += 1;
                    }
                }
                buf.drain(..at);
            }
        }
        let secs = end.saturating_duration_since(measure_from).as_secs_f64();
        Ok(Subscribed {
            transport: plan.transport.name(),
            connections: args.connections,
            interval_ms: ms,
            duration_s: secs,
            subscribed: conns.iter().filter(|c| c.2).count(),
            notifications,
            notifications_per_s: notifications as f64 / secs.max(f64::MIN_POSITIVE),
            dropped,
            errors,
            target: &plan.target,
        })
    };
    let summary = run().map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string(&summary).unwrap_or_default());
    Ok(summary.errors == 0 && summary.subscribed == args.connections)
}
