//! `keel approvals list|approve|deny`: decides approvals through the HTTP API,
//! so it works against any node of a deployment.

use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Value, json};

pub struct Target {
    pub url: String,
    pub key: Option<String>,
}

impl Target {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{}", self.url.trim_end_matches('/'), path);
        let r = reqwest::Client::new().request(method, url);
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }
}

async fn send(req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let resp = req.send().await.context("reaching keel")?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let msg = body["error"]["message"].as_str().unwrap_or("no details");
        bail!("HTTP {}: {msg}", status.as_u16());
    }
    Ok(body)
}

pub async fn list(target: &Target, status: &str) -> anyhow::Result<ExitCode> {
    let body = send(target.request(
        reqwest::Method::GET,
        &format!("/ai/approvals?status={status}"),
    ))
    .await?;
    let list = body["approvals"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no {status} approvals");
    }
    for a in list {
        println!(
            "{}  {}  {}  risk={}  run={}  expires={}\n    arguments: {}\n    reason: {}",
            a["id"].as_str().unwrap_or(""),
            a["status"].as_str().unwrap_or(""),
            a["tool"].as_str().unwrap_or(""),
            a["risk"].as_str().unwrap_or(""),
            a["run_id"].as_str().unwrap_or(""),
            a["expires_at"].as_str().unwrap_or(""),
            a["arguments"],
            a["reason"].as_str().unwrap_or(""),
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn decide(
    target: &Target,
    id: &str,
    approve: bool,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let decision = if approve { "approve" } else { "deny" };
    let body = send(
        target
            .request(reqwest::Method::POST, &format!("/ai/approvals/{id}"))
            .json(&json!({"decision": decision, "reason": reason})),
    )
    .await?;
    println!(
        "{} {} by {}",
        body["id"].as_str().unwrap_or(id),
        body["status"].as_str().unwrap_or(""),
        body["decided_by"].as_str().unwrap_or("")
    );
    Ok(ExitCode::SUCCESS)
}
