//! The command line's S3 flags (feature `cli`).

use serde::{Deserialize, Serialize};

use super::S3Options;

/// The command line's S3 flags; a lock file saves them.
#[derive(clap::Args, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct S3Flags {
    /// S3 path-style addressing (on by default when a custom endpoint is set)
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub path_style: bool,

    /// S3: delete the object on release, so winebarrel/s3lock clients can lock the key
    /// after us (the fencing token then restarts at 1 after each release)
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub s3lock_compatible: bool,
}

impl S3Flags {
    /// These flags, or `saved`'s where set.
    pub fn options(&self, saved: &S3Flags) -> S3Options {
        S3Options {
            force_path_style: (self.path_style || saved.path_style).then_some(true),
            s3lock_compatible: self.s3lock_compatible || saved.s3lock_compatible,
            // `--terraform-compatible` is one flag for both AWS stores (AwsFlags).
            terraform_compatible: false,
        }
    }
}
