//! Wake-ups from other servers: `LISTEN sepp_ready` on a connection of its own, each
//! notification handed to the queue layer's [`ReadyListener`], and a bounded fallback poll.
//!
//! Every transition that makes jobs ready (enqueue, a retry, redelivery, promotion, requeue,
//! resume) sends `NOTIFY sepp_ready, '<origin> <count> <queue>'` in its transaction, delivered
//! at `COMMIT`. A notification can still be lost (the `LISTEN` connection drops and is
//! reconnected, a server starts while it is sent): so every `poll` the waiting Reserves look
//! again anyway ([`ReadyListener::all_may_be_ready`]), and after a reconnect at once. A lost
//! notification costs at most `poll` of latency, never a job.

use crate::storage::ReadyListener;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

/// Parses a `sepp_ready` payload: origin, count, queue.
fn parse(payload: &str) -> Option<(u64, usize, &str)> {
    let mut it = payload.splitn(3, ' ');
    let origin = u64::from_str_radix(it.next()?, 16).ok()?;
    let n = it.next()?.parse().ok()?;
    Some((origin, n, it.next()?))
}

/// Listens until `stop`, reconnecting after a failure (every second at most).
pub(crate) async fn run(
    cfg: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    listener: Arc<dyn ReadyListener>,
    origin: u64,
    cursors: Arc<super::cursor::Cursors>,
    poll: Duration,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        match cfg.connect(tls.clone()).await {
            Ok((client, mut conn)) => {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| conn.poll_message(cx)).boxed();
                // The connection runs only while its messages are polled: LISTEN is sent while
                // they are.
                let ok = {
                    let listen = client.batch_execute("LISTEN sepp_ready");
                    tokio::pin!(listen);
                    loop {
                        tokio::select! {
                            r = &mut listen => break r.is_ok(),
                            m = messages.next() => if m.is_none() { break false; },
                        }
                    }
                };
                if ok {
                    // Notifications sent before this LISTEN (while disconnected, or before the
                    // first one) are not delivered: waiters look once now.
                    cursors.forget_all();
                    listener.all_may_be_ready();
                    let mut tick = tokio::time::interval(poll);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    tick.tick().await;
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            _ = tick.tick() => {
                                cursors.forget_all();
                                listener.all_may_be_ready();
                            }
                            m = messages.next() => match m {
                                Some(Ok(AsyncMessage::Notification(n))) => {
                                    if let Some((from, count, queue)) = parse(n.payload())
                                        && from != origin
                                    {
                                        cursors.forget(queue);
                                        listener.jobs_ready(queue, count);
                                    }
                                }
                                Some(Ok(_)) => {}
                                Some(Err(e)) => {
                                    tracing::warn!(error = %e, "PostgreSQL LISTEN connection failed; reconnecting");
                                    break;
                                }
                                None => break,
                            },
                        }
                    }
                }
                drop(client);
            }
            Err(e) => {
                tracing::warn!(error = %super::schema::error_text(&e), "cannot open the PostgreSQL LISTEN connection; retrying");
            }
        }
        // While disconnected, waiters still look every `poll`.
        cursors.forget_all();
        listener.all_may_be_ready();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(poll.min(Duration::from_secs(1))) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn payloads_parse_with_queue_names_holding_spaces() {
        assert_eq!(
            super::parse("00000000000000ff 3 my queue"),
            Some((255, 3, "my queue"))
        );
        assert_eq!(super::parse("zz 3 q"), None);
        assert_eq!(super::parse("ff x q"), None);
    }
}
