//! A cache of what is computed once per table description.

use std::sync::Arc;

use super::TableDescription;

/// Values computed once per table description, keyed by its address. The `Arc` is
/// held, so an address is never reused while it is a key. Descriptions are
/// replaced when the catalog is read again, so past [`PerTable::BOUND`] entries
/// the old ones are forgotten wholesale.
#[derive(Debug)]
pub struct PerTable<V> {
    entries: std::collections::HashMap<usize, (Arc<TableDescription>, V)>,
}

impl<V> Default for PerTable<V> {
    fn default() -> Self {
        PerTable {
            entries: std::collections::HashMap::new(),
        }
    }
}

impl<V: Clone> PerTable<V> {
    pub const BOUND: usize = 4096;

    /// The value for `table`, computed by `make` the first time.
    pub fn get_or_insert(&mut self, table: &Arc<TableDescription>, make: impl FnOnce() -> V) -> V {
        match self.get_or_try_insert(table, || Ok::<_, std::convert::Infallible>(make())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// As [`get_or_insert`](Self::get_or_insert), for a computation that can fail.
    pub fn get_or_try_insert<E>(
        &mut self,
        table: &Arc<TableDescription>,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        let key = Arc::as_ptr(table) as usize;
        if let Some((_, value)) = self.entries.get(&key) {
            return Ok(value.clone());
        }
        let value = make()?;
        if self.entries.len() > Self::BOUND {
            self.entries.clear();
        }
        self.entries.insert(key, (Arc::clone(table), value.clone()));
        Ok(value)
    }
}
