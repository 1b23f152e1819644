//! Core lists (`--cores 0-3`, `--cores 0,2`, `system.sharding.cpu_allocation = "0-1,3"`) and the
//! CPUs a thread may run on.

use std::collections::BTreeSet;
use std::fmt;

use thiserror::Error;

/// The largest CPU id a core list may name. `sched_getaffinity` with a default `cpu_set_t`
/// covers 1024 CPUs; a larger id is a typo, not a machine.
pub const CPU_ID_MAX: usize = 1023;

/// A non-empty, duplicate-free list of CPU ids in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreList(Vec<usize>);

/// Why a core list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreListError {
    /// Nothing between the separators.
    #[error("empty core list")]
    Empty,
    /// An item is neither `N` nor `A-B`.
    #[error("`{0}` is not a core id or a range like 0-3")]
    Item(String),
    /// `A-B` with `A > B`.
    #[error("range `{0}` runs backwards")]
    Backwards(String),
    /// A core id above [`CPU_ID_MAX`].
    #[error("core {0} is above {CPU_ID_MAX}")]
    TooLarge(usize),
    /// The same core twice (one shard per core).
    #[error("core {0} is listed twice")]
    Duplicate(usize),
}

impl CoreList {
    /// Parses `0-3`, `0,2`, `0-1,3` (whitespace around items allowed). Order is kept: shard `i`
    /// runs on the `i`-th core listed.
    pub fn parse(text: &str) -> Result<CoreList, CoreListError> {
        let mut cores = Vec::new();
        let mut seen = BTreeSet::new();
        if text.trim().is_empty() {
            return Err(CoreListError::Empty);
        }
        for item in text.split(',') {
            let item = item.trim();
            let (low, high) = match item.split_once('-') {
                Some((a, b)) => (parse_id(a.trim(), item)?, parse_id(b.trim(), item)?),
                None => {
                    let id = parse_id(item, item)?;
                    (id, id)
                }
            };
            if low > high {
                return Err(CoreListError::Backwards(item.to_string()));
            }
            for core in low..=high {
                if !seen.insert(core) {
                    return Err(CoreListError::Duplicate(core));
                }
                cores.push(core);
            }
        }
        Ok(CoreList(cores))
    }

    /// Builds a list from ids; `None` when it is empty or has a duplicate.
    pub fn from_ids(ids: Vec<usize>) -> Option<CoreList> {
        let unique: BTreeSet<usize> = ids.iter().copied().collect();
        (!ids.is_empty() && unique.len() == ids.len()).then_some(CoreList(ids))
    }

    /// The cores, in order.
    pub fn ids(&self) -> &[usize] {
        &self.0
    }

    /// How many cores (= shards when pinned).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a core list is never empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn parse_id(text: &str, item: &str) -> Result<usize, CoreListError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CoreListError::Item(item.to_string()));
    }
    let id: usize = text
        .parse()
        .map_err(|_| CoreListError::TooLarge(usize::MAX))?;
    if id > CPU_ID_MAX {
        return Err(CoreListError::TooLarge(id));
    }
    Ok(id)
}

impl fmt::Display for CoreList {
    /// Compact form: runs of consecutive ids as `a-b`, the rest comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let mut j = i;
            while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j > i {
                write!(f, "{}-{}", self.0[i], self.0[j])?;
            } else {
                write!(f, "{}", self.0[i])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

/// The CPUs the calling thread may run on (`sched_getaffinity(0)`), ascending.
pub fn thread_allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain old data for which all-zero bytes are a valid (empty) set;
    // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into it, and `CPU_ISSET`
    // reads it within bounds for every id below `CPU_SETSIZE`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_and_commas() {
        assert_eq!(CoreList::parse("0-3").unwrap().ids(), [0, 1, 2, 3]);
        assert_eq!(CoreList::parse("0,2").unwrap().ids(), [0, 2]);
        assert_eq!(CoreList::parse("0-1,3").unwrap().ids(), [0, 1, 3]);
        assert_eq!(CoreList::parse(" 5 , 1-2 ").unwrap().ids(), [5, 1, 2]);
        assert_eq!(CoreList::parse("7").unwrap().ids(), [7]);
    }

    #[test]
    fn refusals_name_the_item() {
        assert_eq!(CoreList::parse(""), Err(CoreListError::Empty));
        assert_eq!(
            CoreList::parse("0,,1"),
            Err(CoreListError::Item(String::new()))
        );
        assert_eq!(CoreList::parse("a"), Err(CoreListError::Item("a".into())));
        assert_eq!(CoreList::parse("-1"), Err(CoreListError::Item("-1".into())));
        assert_eq!(CoreList::parse("1-"), Err(CoreListError::Item("1-".into())));
        assert_eq!(
            CoreList::parse("0-1-2"),
            Err(CoreListError::Item("0-1-2".into()))
        );
        assert_eq!(
            CoreList::parse("3-1"),
            Err(CoreListError::Backwards("3-1".into()))
        );
        assert_eq!(CoreList::parse("0-2,2"), Err(CoreListError::Duplicate(2)));
        assert_eq!(CoreList::parse("1024"), Err(CoreListError::TooLarge(1024)));
        assert_eq!(CoreList::parse("+1"), Err(CoreListError::Item("+1".into())));
        assert_eq!(
            CoreList::parse("0-99999999999999999999999"),
            Err(CoreListError::TooLarge(usize::MAX))
        );
    }

    #[test]
    fn the_calling_thread_has_some_cpu() {
        assert!(!thread_allowed_cpus().unwrap().is_empty());
    }

    proptest! {
        /// Display gives a list that parses back to the same cores.
        #[test]
        fn display_round_trips(ids in proptest::collection::btree_set(0usize..=CPU_ID_MAX, 1..40)) {
            let list = CoreList::from_ids(ids.into_iter().collect()).unwrap();
            prop_assert_eq!(CoreList::parse(&list.to_string()).unwrap(), list);
        }
    }
}
