//! [`Service::serve`]: the server on a listener, and its graceful shutdown.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;

use super::{Service, conn, connection_cap};
use arbor::Error;

impl Service {
    /// Ends every event stream and fails readiness (a shutdown has begun).
    pub fn stop(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Serves on `listener` until `signal` completes, then shuts down
    /// gracefully: stops accepting, ends event streams, lets open requests
    /// finish, and waits for the store to take everything emitted so far
    /// (every run's last checkpoint), each within `shutdown_timeout`. Trees
    /// still running are left interrupted, to resume on the next start.
    ///
    /// Connections are HTTP/1.1 under the service's [`ServiceLimits`](super::ServiceLimits): a
    /// header-read and an idle timeout, and a cap on open connections kept
    /// under the process's open-files limit (raised to its hard limit first);
    /// `conn.rs` says what happens at the cap.
    pub async fn serve(
        self,
        listener: TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let timeout = self.shared.options.shutdown_timeout;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Service(format!("the listener has no address: {e}")))?;
        self.shared.options.check_bind(local)?;
        let limits = self.shared.limits;
        let fd_limit = conn::raise_fd_limit();
        let cap = connection_cap(limits.max_connections, fd_limit);
        if cap < limits.max_connections {
            tracing::warn!(
                max_connections = limits.max_connections,
                open_files = fd_limit,
                "accepting at most {cap} connections: the open-files limit leaves room for no more"
            );
        }
        let connections = conn::Connections::new(cap);
        let app = self.router();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<tokio::time::Instant>();
        let this = self.clone();
        let mut stopping = self.shared.shutdown.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = signal => {}
                // Stopped some other way (`Service::stop`): the signal is moot.
                _ = stopping.wait_for(|stop| *stop) => {}
            }
            tracing::info!("shutting down: no new connections, ending event streams");
            // The deadline before the stop, which lets the server's future end.
            let _ = stopped_tx.send(tokio::time::Instant::now() + timeout);
            this.stop();
        });
        let server = conn::serve(
            listener,
            app,
            limits,
            connections.clone(),
            self.shared.shutdown.subscribe(),
        );
        let mut server = std::pin::pin!(server);
        // One bound for the whole shutdown: open requests, then the store.
        let mut deadline = None;
        tokio::select! {
            () = &mut server => {}
            () = async {
                if let Ok(at) = stopped_rx.await {
                    deadline = Some(at);
                    tokio::time::sleep_until(at).await;
                }
            } => {
                tracing::warn!("requests still open after {timeout:?}; closing them");
                connections.close_all();
            }
        };
        let left = deadline
            .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
            .unwrap_or(timeout)
            .max(Duration::from_secs(1));
        let supervisor = self.shared.runtime.supervisor();
        match tokio::time::timeout(left, supervisor.release()).await {
            Ok(Ok(trees)) => tracing::info!(
                trees = trees.len(),
                "store flushed; running trees handed over, to resume on the next start"
            ),
            Ok(Err(error)) => tracing::error!(%error, "the store failed while shutting down"),
            Err(_) => tracing::error!("the store did not flush within {left:?}"),
        }
        Ok(())
    }
}
