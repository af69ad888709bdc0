//! What a controller command answers: its status, completion dwords and data ([`Reply`]),
//! shared by the admin commands, the log pages, features, properties and the connection
//! that sends it.

use pollux_nvme::spec::Status;

/// The result of a command: status, completion dwords and data for the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Status.
    pub status: Status,
    /// Completion dword 0.
    pub dw0: u32,
    /// Completion dword 1.
    pub dw1: u32,
    /// Controller-to-host data.
    pub data: Vec<u8>,
}

impl Reply {
    /// Success without data.
    pub fn ok() -> Self {
        Self::dw0(0)
    }
    /// Success with a result dword.
    pub fn dw0(dw0: u32) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            data: Vec::new(),
        }
    }
    /// Success with data.
    pub fn data(data: Vec<u8>) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data,
        }
    }
    /// An error.
    pub fn err(status: Status) -> Self {
        Self {
            status,
            dw0: 0,
            dw1: 0,
            data: Vec::new(),
        }
    }
}
