//! One status enum for the whole library, shared by the engine and the C ABI.

use std::fmt;

/// Outcome of a call, of a job, or of one key inside a job.
///
/// The numeric values are part of the ABI: never renumber, only append.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullArgument = 1,
    /// An argument was out of range or malformed (block id, key length, zero keys, UTF-8...).
    InvalidArgument = 2,
    /// The configuration JSON was malformed, had an unknown key, or a bad value.
    Config = 3,
    /// The store could not be reached (DNS, refused connection, timeout at start-up).
    Connect = 4,
    /// A storage operation failed (after retries).
    Io = 5,
    /// The object does not exist.
    NotFound = 6,
    /// The call is not valid in the tier's current state (memory not registered,
    /// registered twice...).
    State = 7,
    /// An internal error (a Rust panic) was caught at the boundary. The tier then refuses
    /// further work: only collecting results and shutting it down still work.
    Panic = 8,
    /// The job id already has a result pending (submitted and not yet polled).
    DuplicateJob = 9,
    /// The tier has been shut down.
    ShutDown = 10,
    /// The tier shut down before the work finished (not started, or abandoned after
    /// `shutdown_timeout_ms`).
    Cancelled = 11,
    /// A deadline passed (drain timeout, request timeout).
    Timeout = 12,
    /// The stored object's length differs from the registered block size.
    LengthMismatch = 13,
    /// The stored object's checksum does not match its bytes.
    Corrupt = 14,
    /// The store rejected the credentials (invalid access key, bad signature, expired token).
    Auth = 15,
    /// The store refused access to the bucket or key (HTTP 403).
    PermissionDenied = 16,
    /// The bucket or container does not exist.
    BucketNotFound = 17,
    /// TLS failed: the server certificate could not be verified.
    Tls = 18,
    /// The tier was created by another process: this process is a fork() child of it.
    /// Only `kvt_tier_free` may be called on such a tier.
    Forked = 19,
    /// A block of the job is held by another job whose result has not been polled yet: a
    /// load needs its block alone; store jobs may share theirs.
    BlockBusy = 20,
    /// An encrypted object did not open with the tier's keyring: its key is not in the
    /// ring, or it failed authentication (tampered with, copied under another name, or
    /// not an encrypted object). The key answers MISS and its next store rewrites it; the
    /// object is never deleted for it.
    Undecryptable = 21,
}

impl Status {
    /// Every status, in code order (codes are contiguous from 0).
    pub const ALL: [Status; 22] = {
        use Status::*;
        [
            Ok,
            NullArgument,
            InvalidArgument,
            Config,
            Connect,
            Io,
            NotFound,
            State,
            Panic,
            DuplicateJob,
            ShutDown,
            Cancelled,
            Timeout,
            LengthMismatch,
            Corrupt,
            Auth,
            PermissionDenied,
            BucketNotFound,
            Tls,
            Forked,
            BlockBusy,
            Undecryptable,
        ]
    };

    /// The status with this numeric code, if any.
    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| *s as i32 == code)
    }

    /// The name in snake case, as in the C enum without its `KVT_STATUS_` prefix:
    /// `not_found`, `length_mismatch`...
    pub fn name(self) -> String {
        let mut out = String::new();
        for (i, c) in format!("{self:?}").chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }

    /// A short, static English description, NUL-terminated for the C ABI.
    pub fn as_cstr(self) -> &'static std::ffi::CStr {
        match self {
            Status::Ok => c"ok",
            Status::NullArgument => c"null argument",
            Status::InvalidArgument => c"invalid argument",
            Status::Config => c"configuration error",
            Status::Connect => c"cannot connect to store",
            Status::Io => c"storage I/O error",
            Status::NotFound => c"not found",
            Status::State => c"invalid state",
            Status::Panic => c"internal panic",
            Status::DuplicateJob => c"duplicate job id",
            Status::ShutDown => c"tier is shut down",
            Status::Cancelled => c"cancelled",
            Status::Timeout => c"timed out",
            Status::LengthMismatch => c"object length differs from block size",
            Status::Corrupt => c"checksum mismatch",
            Status::Auth => c"authentication failed",
            Status::PermissionDenied => c"permission denied",
            Status::BucketNotFound => c"bucket not found",
            Status::Tls => c"TLS error",
            Status::Forked => c"tier belongs to the parent process",
            Status::BlockBusy => c"block held by another job",
            Status::Undecryptable => c"object does not open with the keyring",
        }
    }

    pub fn as_str(self) -> &'static str {
        // Every literal above is ASCII.
        self.as_cstr().to_str().unwrap_or("")
    }

    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}

/// An error: a status plus a message a user can act on. Messages never contain secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, message)
    }
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(Status::Config, message)
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(Status::State, message)
    }
}

impl Error {
    /// The error of a task of the tier's runtime that did not return: cancelled (the tier
    /// shut down and abandoned it) or panicked.
    pub fn join(what: &str, e: &tokio::task::JoinError) -> Self {
        if e.is_cancelled() {
            Self::new(
                Status::Cancelled,
                format!("{what}: the tier shut down before the operation finished"),
            )
        } else {
            Self::new(Status::Io, format!("{what}: {e}"))
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The message a panic carried, for the error that reports it.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_task_is_cancelled_not_an_io_error() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = runtime.block_on(async {
            let task = tokio::spawn(std::future::pending::<()>());
            task.abort();
            task.await.unwrap_err()
        });
        let error = Error::join("load a/b.bin", &e);
        assert_eq!(error.status, Status::Cancelled, "{error}");
        assert!(error.message.starts_with("load a/b.bin: "), "{error}");
        let wrapped = object_store::Error::JoinError { source: e };
        let object_store::Error::JoinError { source } = &wrapped else {
            unreachable!()
        };
        assert_eq!(Error::join("store x", source).status, Status::Cancelled);
    }
}
