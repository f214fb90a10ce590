//! A volume's own credentials: the Secret a PersistentVolume names in `nodeStageSecretRef` (or
//! `nodePublishSecretRef`), which the kubelet reads and passes in the request's `secrets`, become
//! variables of that volume's daemon alone — the names its store's credential chain reads. They
//! travel from the node plugin to the mounter on the hand-over socket and from the mounter to
//! the daemon in its environment: never on a command line, in a log, in `stats` or metrics, or
//! in a file of the work directory. A volume without a Secret uses the mounter's own
//! environment (the node's identity, or the ServiceAccount's: docs/CLUSTERS.md).
//!
//! The Secret's keys, as each store's own tools name them:
//!
//! | key | store | the daemon's variable |
//! |---|---|---|
//! | `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token` | S3 (as in `~/.aws/credentials`) | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` |
//! | `service_account.json` | GCS: a service account's JSON key | `GOOGLE_SERVICE_ACCOUNT_KEY` (object_store's name for the key itself) |
//! | `azure_storage_connection_string` | Azure (as `az storage` takes it) | `AZURE_STORAGE_CONNECTION_STRING` |
//! | `azure_storage_sas_token` | Azure: a SAS token | `AZURE_STORAGE_SAS_TOKEN` |
//! | `azure_storage_account_name`, `azure_storage_account_key` | Azure: an account and its key | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` |

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The Secret keys a volume may give, with the variable each becomes (the module's table).
pub const KEYS: &[(&str, &str)] = &[
    ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
    ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
    ("aws_session_token", "AWS_SESSION_TOKEN"),
    ("service_account.json", "GOOGLE_SERVICE_ACCOUNT_KEY"),
    (
        "azure_storage_connection_string",
        "AZURE_STORAGE_CONNECTION_STRING",
    ),
    ("azure_storage_sas_token", "AZURE_STORAGE_SAS_TOKEN"),
    ("azure_storage_account_name", "AZURE_STORAGE_ACCOUNT_NAME"),
    ("azure_storage_account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
];

/// A daemon's credential variables (name → value). Its `Debug` shows the names only, so a
/// request logged by mistake never shows a value.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Secrets {
    /// The variables for a request's `secrets` (the Secret's keys and values).
    ///
    /// Errors: a key the driver does not know, named with the known ones (never a value); an
    /// empty value.
    pub fn from_request(
        given: &std::collections::HashMap<String, String>,
    ) -> Result<Secrets, String> {
        let mut vars = BTreeMap::new();
        let mut keys: Vec<&String> = given.keys().collect();
        keys.sort();
        for key in keys {
            let Some((_, var)) = KEYS.iter().find(|(k, _)| k == key) else {
                return Err(format!(
                    "the volume's Secret has a key {key:?} the driver does not know; give only {}",
                    KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                ));
            };
            let value = &given[key];
            if value.trim().is_empty() {
                return Err(format!("the volume's Secret's key {key:?} is empty"));
            }
            vars.insert((*var).to_string(), value.clone());
        }
        Ok(Secrets(vars))
    }

    /// The variables and their values, to set in the daemon's environment.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The variables' names, sorted (what a record or a log may show).
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_their_stores_variables_and_debug_shows_no_value() {
        let given = [
            ("aws_access_key_id".to_string(), "AKIDEXAMPLE".to_string()),
            ("aws_secret_access_key".to_string(), "s3cr3t".to_string()),
        ]
        .into();
        let s = Secrets::from_request(&given).unwrap();
        assert_eq!(
            s.vars().collect::<Vec<_>>(),
            [
                ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                ("AWS_SECRET_ACCESS_KEY", "s3cr3t")
            ]
        );
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("s3cr3t") && shown.contains("AWS_SECRET_ACCESS_KEY"),
            "{shown}"
        );
    }

    #[test]
    fn an_unknown_key_is_named_without_its_value() {
        let given = [("password".to_string(), "hunter2".to_string())].into();
        let e = Secrets::from_request(&given).unwrap_err();
        assert!(e.contains("\"password\"") && !e.contains("hunter2"), "{e}");
        let given = [("aws_session_token".to_string(), " ".to_string())].into();
        assert!(Secrets::from_request(&given).unwrap_err().contains("empty"));
    }
}
