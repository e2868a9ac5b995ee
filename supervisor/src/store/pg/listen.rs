//! Wake-ups: a connection of its own that `LISTEN`s to `arbor_journal`
//! (a batch with events committed: `<tree>:<last seq>`), `arbor_control`
//! (a control was posted: `<tree>`) and `arbor_released` (a process
//! released its trees at shutdown: how many), forwarded to a channel.

use std::sync::mpsc;

use futures::StreamExt as _;
use tokio_postgres::{AsyncMessage, NoTls};

use super::PgStore;
use crate::error::Error;
use crate::store::Wake;

/// A notification as a wake-up; `None` for one of another channel or a
/// payload no build sends.
fn wake(channel: &str, payload: &str) -> Option<Wake> {
    match channel {
        "arbor_journal" => {
            let (tree, seq) = payload.rsplit_once(':')?;
            Some(Wake::Journal {
                tree_id: tree.to_owned(),
                seq: seq.parse().ok()?,
            })
        }
        "arbor_control" => Some(Wake::Control {
            tree_id: payload.to_owned(),
        }),
        "arbor_released" => Some(Wake::Released {
            trees: payload.parse().ok()?,
        }),
        _ => None,
    }
}

impl PgStore {
    /// Opens the `LISTEN` connection; its wake-ups arrive on the receiver
    /// from the moment this returns. The channel closes when the connection
    /// is lost (the follower goes on polling, and may subscribe again); the
    /// connection closes at the first wake-up after the receiver is dropped.
    pub(super) fn listen(&self) -> Result<mpsc::Receiver<Wake>, Error> {
        let (tx, rx) = mpsc::channel();
        let io = self.io();
        let config = self.config.clone();
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| Error::Store("the store is closing".into()))?;
        self.block(async {
            let (client, mut connection) = config.connect(NoTls).await.map_err(&io)?;
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            let (ready_tx, ready) = futures::channel::oneshot::channel::<()>();
            runtime.spawn(async move {
                // The client lives as long as the connection is driven.
                let client = client;
                let mut ready_tx = Some(ready_tx);
                let listening = async {
                    let done = client
                        .batch_execute(
                            "LISTEN arbor_journal; LISTEN arbor_control; LISTEN arbor_released",
                        )
                        .await;
                    if done.is_ok()
                        && let Some(ready) = ready_tx.take()
                    {
                        let _ = ready.send(());
                    }
                    futures::future::pending::<()>().await;
                };
                let forward = async {
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(n)) => {
                                if let Some(w) = wake(n.channel(), n.payload())
                                    && tx.send(w).is_err()
                                {
                                    break;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(
                                    "the store's wake-up connection was lost ({e}): followers poll"
                                );
                                break;
                            }
                        }
                    }
                };
                futures::pin_mut!(listening, forward);
                futures::future::select(listening, forward).await;
            });
            ready
                .await
                .map_err(|_| Error::Store("the store's LISTEN connection failed".into()))
        })?;
        Ok(rx)
    }
}
