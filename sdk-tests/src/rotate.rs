//! The suite's client for failovers: what the SDK does not do itself (docs/sdk.md, "Replies,
//! retries and reconnects"). With `AutoLogin::Disabled` a call in flight when its node dies
//! fails `Disconnected`, and `connect()` would dial the same dead address again (forever with
//! the default reconnection settings); the SDK moves to another node only through the leader
//! check after a login, which needs a live node to ask. So on any failed call this client
//! drops its SDK client, builds a new one on the next address of the roster, connects, logs
//! in (the SDK then follows GetClusterMetadata to the leader) and retries the call, until it
//! succeeds or [`CLUSTER_BOUND`] passes. A retried send may append twice (partition ops are
//! at least once, client-plane.md §2.3).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use iggy::prelude::*;

use crate::{CLUSTER_BOUND, STEP_BOUND};

/// A future borrowing the client it runs on.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, IggyError>> + Send + 'a>>;

/// A step run on every new SDK client right after its login, before any call (what a new
/// session must redo, e.g. a consumer group's Join: memberships are sessions, decision 315).
pub type AfterLogin = Box<dyn for<'a> Fn(&'a IggyClient) -> Call<'a, ()> + Send + Sync>;

/// An SDK client that rotates through the roster's addresses and logs in again after a
/// failure.
pub struct RotatingClient {
    addresses: Vec<String>,
    next: usize,
    username: String,
    password: String,
    client: Option<IggyClient>,
    after_login: Option<AfterLogin>,
    /// Reconnections made (each a new SDK client and a login).
    pub reconnects: u32,
    /// The failures that caused them, as `(what, error)`, for the test's report.
    pub failures: Vec<(String, String)>,
}

impl RotatingClient {
    /// A client that will dial `addresses` in order, starting with the first.
    pub fn new(addresses: Vec<String>, username: &str, password: &str) -> RotatingClient {
        assert!(!addresses.is_empty());
        RotatingClient {
            addresses,
            next: 0,
            username: username.to_owned(),
            password: password.to_owned(),
            client: None,
            after_login: None,
            reconnects: 0,
            failures: Vec::new(),
        }
    }

    /// Runs `step` after every login (the first one too); a failing step counts as a failed
    /// dial, so the next address is tried.
    pub fn after_login(mut self, step: AfterLogin) -> RotatingClient {
        self.after_login = Some(step);
        self
    }

    /// The address the SDK client is on now (after its leader redirect), if connected.
    pub async fn address(&self) -> Option<String> {
        match &self.client {
            Some(c) => Some(c.get_connection_info().await.server_address),
            None => None,
        }
    }

    /// Connects and logs in on the next address, once; the error says what failed.
    async fn dial(&mut self) -> Result<(), String> {
        let address = self.addresses[self.next % self.addresses.len()].clone();
        self.next += 1;
        let client = IggyClient::builder()
            .with_tcp()
            .with_server_address(address.clone())
            .with_reconnection_max_retries(Some(0))
            .build()
            .map_err(|e| format!("building a client for {address}: {e:?}"))?;
        let attempt = async {
            client.connect().await?;
            client.login_user(&self.username, &self.password).await?;
            if let Some(step) = &self.after_login {
                step(&client).await?;
            }
            Ok::<(), IggyError>(())
        };
        match tokio::time::timeout(STEP_BOUND, attempt).await {
            Ok(Ok(())) => {
                let on = client.get_connection_info().await.server_address;
                eprintln!("rotating client: logged in via {address}, now on {on}");
                self.client = Some(client);
                Ok(())
            }
            Ok(Err(e)) => Err(format!("{address}: {e:?}")),
            Err(_) => Err(format!("{address}: no login within {STEP_BOUND:?}")),
        }
    }

    /// Runs `call` on the current SDK client, reconnecting (next address, login) and retrying
    /// after any failure or a call that takes longer than [`STEP_BOUND`]; panics naming
    /// `what` with the last error when [`CLUSTER_BOUND`] passes.
    pub async fn call<T>(
        &mut self,
        what: &str,
        call: impl for<'a> Fn(&'a IggyClient) -> Call<'a, T>,
    ) -> T {
        let deadline = Instant::now() + CLUSTER_BOUND;
        let mut last = String::from("never tried");
        loop {
            if Instant::now() >= deadline {
                panic!("`{what}`: no success within {CLUSTER_BOUND:?}; last error {last}");
            }
            if self.client.is_none()
                && let Err(e) = self.dial().await
            {
                last = e;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            let client = self.client.as_ref().expect("dialed above");
            match tokio::time::timeout(STEP_BOUND, call(client)).await {
                Ok(Ok(value)) => return value,
                Ok(Err(e)) => last = format!("{e:?}"),
                Err(_) => last = format!("no answer within {STEP_BOUND:?}"),
            }
            eprintln!("rotating client: `{what}` failed ({last}); reconnecting");
            self.failures.push((what.to_owned(), last.clone()));
            self.reconnects += 1;
            if let Some(old) = self.client.take() {
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(1), old.disconnect()).await;
            }
        }
    }
}
