//! Transactions against the simulated tables: each statement applied and logged
//! as SQL Server's log would hold it, for the capture job to scan.

use super::*;

impl Transaction {
    /// `INSERT` of one row (values in table column order).
    pub fn insert(mut self, table: &str, row: Vec<Value>) -> Self {
        self.statements
            .push(vec![Statement::Insert(table.into(), row)]);
        self
    }

    /// `UPDATE … SET` the given columns of the row with key values `key`.
    pub fn update(mut self, table: &str, key: Vec<Value>, set: Vec<(&str, Value)>) -> Self {
        let set = set.into_iter().map(|(c, v)| (c.to_owned(), v)).collect();
        self.statements
            .push(vec![Statement::Update(table.into(), key, set)]);
        self
    }

    /// One `UPDATE` statement touching several rows: one command id, a seqval each.
    pub fn update_many(
        mut self,
        table: &str,
        keys: Vec<Vec<Value>>,
        set: Vec<(&str, Value)>,
    ) -> Self {
        let set: Vec<(String, Value)> = set.into_iter().map(|(c, v)| (c.to_owned(), v)).collect();
        self.statements.push(
            keys.into_iter()
                .map(|key| Statement::Update(table.into(), key, set.clone()))
                .collect(),
        );
        self
    }

    /// `DELETE` of the row with key values `key`.
    pub fn delete(mut self, table: &str, key: Vec<Value>) -> Self {
        self.statements
            .push(vec![Statement::Delete(table.into(), key)]);
        self
    }

    /// Gives later statements lower `__$seqval`s than earlier ones, as SQL Server can
    /// for some statements: only `__$command_id` then orders them correctly.
    pub fn with_reversed_seqvals(mut self) -> Self {
        self.reverse_seqvals = true;
        self
    }

    /// Commits to the tables and the log: returns the commit LSN (`__$start_lsn` of
    /// every row). The change rows appear when the capture job scans.
    pub fn commit(self) -> Result<Lsn, String> {
        let mut state = self.sim.lock();
        state.now += Duration::milliseconds(7);
        let begin_lsn = state.next_lsn();
        let row_count: usize = self.statements.iter().map(Vec::len).sum();
        let mut seqvals: Vec<Lsn> = (0..row_count).map(|_| state.next_lsn()).collect();
        if self.reverse_seqvals {
            seqvals.reverse();
        }
        let commit_lsn = state.next_lsn();
        let end_time = datetime(state.now);
        let mut seqvals = seqvals.into_iter();
        let mut undo = Vec::new();
        let images = match apply(
            &mut state,
            self.statements,
            &mut seqvals,
            commit_lsn,
            &mut undo,
        ) {
            Ok(images) => images,
            Err(refused) => {
                // A statement failed: the transaction rolls back whole, as SQL
                // Server's does, and the log never holds it.
                for (table, step) in undo.into_iter().rev() {
                    if let Ok(t) = table_mut(&mut state, &table) {
                        match step {
                            Undo::Remove(key) => {
                                t.rows.remove(&key);
                            }
                            Undo::Restore(key, row) => {
                                t.rows.insert(key, row);
                            }
                        }
                    }
                }
                return Err(refused);
            }
        };
        state.log.push(LogRecord::Commit {
            commit_lsn,
            begin_lsn,
            end_time,
            images,
        });
        if !state.manual_capture {
            state.scan();
        }
        Ok(commit_lsn)
    }
}

/// What rolls a statement's effect on a table back.
enum Undo {
    Remove(SortKey),
    Restore(SortKey, Vec<Value>),
}

/// Applies `statements` to the tables, each row's effect undoable through `undo`
/// (per table, in order), and returns the log's images of them.
fn apply(
    state: &mut SimState,
    statements: Vec<Vec<Statement>>,
    seqvals: &mut impl Iterator<Item = Lsn>,
    commit_lsn: Lsn,
    undo: &mut Vec<(String, Undo)>,
) -> Result<Vec<Image>, String> {
    let mut images = Vec::new();
    for (command, statement) in statements.into_iter().enumerate() {
        let command_id = i32::try_from(command + 1).unwrap_or(i32::MAX);
        for row_statement in statement {
            let seqval = seqvals.next().unwrap_or(commit_lsn);
            let image = |table: String, operation, columns, old, new, changed| Image {
                table,
                operation,
                command_id,
                seqval,
                columns,
                old,
                new,
                changed,
            };
            let (table, operation, old, new, changed) = match row_statement {
                Statement::Insert(table, row) => {
                    let key = insert_row(table_mut(state, &table)?, &table, &row)?;
                    undo.push((table.clone(), Undo::Remove(key)));
                    (table, op::INSERT, None, Some(row), None)
                }
                Statement::Update(table, key_values, set) => {
                    let t = table_mut(state, &table)?;
                    let (old, new, changed) = update_row(t, &table, &key_values, set)?;
                    // Undone last step first: the new key goes, then the old row is back.
                    undo.push((
                        table.clone(),
                        Undo::Restore(sort_key(&key_values), old.clone()),
                    ));
                    undo.push((table.clone(), Undo::Remove(t.key_of(&new))));
                    (table, op::UPDATE_AFTER, Some(old), Some(new), Some(changed))
                }
                Statement::Delete(table, key_values) => {
                    let t = table_mut(state, &table)?;
                    let key = sort_key(&key_values);
                    let old = t
                        .rows
                        .remove(&key)
                        .ok_or(format!("{table}: no row {key:?}"))?;
                    undo.push((table.clone(), Undo::Restore(key, old.clone())));
                    (table, op::DELETE, Some(old), None, None)
                }
            };
            let columns = table_mut(state, &table)?.column_ids();
            images.push(image(table, operation, columns, old, new, changed));
        }
    }
    Ok(images)
}

/// `__$update_mask`: all captured columns for inserts and deletes, the changed ones
/// for updates.
pub(super) fn update_mask(
    columns: &[CapturedColumn],
    ids: &[u32],
    changed: Option<&[u32]>,
) -> Vec<u8> {
    let set = columns
        .iter()
        .zip(ids)
        .filter(|(_, id)| changed.is_none_or(|ch| ch.contains(id)))
        .map(|(c, _)| c.ordinal as usize);
    mssql_ces::source::update_mask(columns.len(), set)
}

/// The simulated table `table`, or an error naming it.
fn table_mut<'a>(state: &'a mut SimState, table: &str) -> Result<&'a mut SimTable, String> {
    state
        .tables
        .get_mut(table)
        .ok_or(format!("no table {table}"))
}

/// `INSERT`: the row, refused when its key is taken; returns the key it is stored
/// under.
fn insert_row(t: &mut SimTable, table: &str, row: &[Value]) -> Result<SortKey, String> {
    if row.len() != t.columns.len() {
        return Err(format!(
            "{table}: {} values for {} columns",
            row.len(),
            t.columns.len()
        ));
    }
    let key = t.new_key(row);
    if t.rows.contains_key(&key) {
        return Err(format!("{table}: duplicate key {key:?}"));
    }
    t.rows.insert(key.clone(), row.to_vec());
    Ok(key)
}

/// A row before and after an update, and the ids of the columns set.
type Updated = (Vec<Value>, Vec<Value>, Vec<u32>);

/// `UPDATE … SET` of the row with `key_values`.
fn update_row(
    t: &mut SimTable,
    table: &str,
    key_values: &[Value],
    set: Vec<(String, Value)>,
) -> Result<Updated, String> {
    if t.key.is_empty() {
        return Err(format!(
            "{table}: a table without a key (rows cannot be addressed here)"
        ));
    }
    let key = sort_key(key_values);
    let old = t
        .rows
        .get(&key)
        .cloned()
        .ok_or(format!("{table}: no row {key:?}"))?;
    let mut new = old.clone();
    let mut changed = Vec::new();
    for (column, value) in set {
        let i = t
            .columns
            .iter()
            .position(|c| c.name == column)
            .ok_or(format!("{table}: no column {column}"))?;
        new[i] = value;
        changed.push(t.columns[i].id);
    }
    let new_key = t.key_of(&new);
    if new_key != key && t.rows.contains_key(&new_key) {
        return Err(format!("{table}: duplicate key {new_key:?}"));
    }
    t.rows.remove(&key);
    t.rows.insert(new_key, new.clone());
    Ok((old, new, changed))
}
