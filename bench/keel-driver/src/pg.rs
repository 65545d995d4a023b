//! keel on PostgreSQL: a database of its own for each driver process,
//! created on the server the harness names and dropped at the end, as the
//! `langgraph-postgres` peer does. `psql` (the PostgreSQL client) does the
//! two statements; nothing else here talks to the server.

use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::process::Command;

pub struct Database {
    admin_url: String,
    name: String,
    /// What keel's `database_url` is set to.
    pub url: String,
}

impl Database {
    pub async fn create(admin_url: &str) -> Result<Database, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("keel_bench_{}_{nanos:08x}", std::process::id());
        let url = with_database(admin_url, &name)?;
        psql(admin_url, &format!("CREATE DATABASE {name}")).await?;
        Ok(Database {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    /// Drops the database; keel must have stopped (its connections closed).
    pub async fn drop_now(self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = psql(&self.admin_url, &sql).await {
            eprintln!("keel-driver: {e}");
        }
    }
}

async fn psql(url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new("psql")
        .arg(url)
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| {
            format!("running psql (the PostgreSQL client, needed for --database-url): {e}")
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "psql `{sql}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `url` with its database (the path) replaced by `name`, query kept.
fn with_database(url: &str, name: &str) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url}: not a URL"))?;
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    Ok(format!("{scheme}://{authority}/{name}{query}"))
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_is_swapped_and_the_rest_kept() {
        let url = |u| with_database(u, "db2").unwrap();
        assert_eq!(
            url("postgres://u@h:5432/postgres"),
            "postgres://u@h:5432/db2"
        );
        assert_eq!(url("postgresql://h"), "postgresql://h/db2");
        assert_eq!(
            url("postgres://u:p@h/x?sslmode=disable"),
            "postgres://u:p@h/db2?sslmode=disable"
        );
        assert_eq!(
            url("postgres://h?sslmode=disable"),
            "postgres://h/db2?sslmode=disable"
        );
        assert!(with_database("nope", "db2").is_err());
    }
}
