//! Python frames in the recording: the ptrace backend's reader (crate::python) names a
//! sample's Python frames once the target runs again and hands them to the recorder as
//! records (a code object before the first frames that name it, a sample's frames right
//! after the sample). What became of them (interpreters found, samples with frames, why
//! a process's were not read) is one line of the recording's figures, kept here until
//! the recording ends.

#[derive(Default)]
pub(super) struct PythonFrames {
    outcome: Option<String>,
}

impl PythonFrames {
    pub(super) fn set_outcome(&mut self, outcome: Option<String>) {
        self.outcome = outcome;
    }

    pub(super) fn outcome(&self) -> Option<String> {
        self.outcome.clone()
    }
}
