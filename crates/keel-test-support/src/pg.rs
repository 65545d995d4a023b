//! A PostgreSQL database of its own for one test, on the machine's server,
//! dropped when the test ends (even when it fails). A server that is not
//! reachable fails the test with a clear message: PostgreSQL tests never
//! pass silently.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::Connection;
use sqlx::postgres::PgConnection;

const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The admin URL tests create their databases through (`KEEL_TEST_PG_URL`).
pub fn admin_url() -> String {
    std::env::var("KEEL_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.to_owned())
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{database}?{query}"),
        None => format!("{root}/{database}"),
    }
}

pub struct TestDb {
    admin: String,
    pub name: String,
    /// URL of the test's own database.
    pub url: String,
}

impl TestDb {
    pub async fn create() -> Self {
        let admin = admin_url();
        let name = keel_protocol::new_id("keel_test");
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is required for these tests and is not reachable at {admin} ({e}). \
                 Start it, or point KEEL_TEST_PG_URL at an admin URL of a server that is up."
            )
        });
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        conn.close().await.unwrap();
        let url = with_database(&admin, &name);
        Self { admin, name, url }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down:
        // a thread with a runtime of its own does the cleanup.
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut conn = PgConnection::connect(&admin).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await
            })
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("dropping test database {} panicked", self.name),
        }
    }
}
