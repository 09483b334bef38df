//! What SQL Server's seek on a change table examines for one page of the change
//! query — a cost model for the CDC simulator, derived from the query text the SQL
//! Server source sends (parsed with `sqlparser`), not declared beside it.
//!
//! The model: a change table's clustered index is (`__$start_lsn`, `__$command_id`,
//! `__$seqval`, `__$operation`). In each `SELECT` that filters the table, the
//! top-level conjuncts that compare an index column with a parameter are seek
//! predicates as long as they form a prefix of equalities followed by one range
//! (Craig Freedman, "Seek Predicates": a column after the first is seekable only
//! under an equality on every column before it); everything else (an `OR`, a
//! comparison on a later column) is a residual predicate, evaluated on every row
//! the seek reads. A branch reads its seek range in index order until its `TOP`
//! has that many rows passing the whole predicate: the rows it examines are the
//! ones read before the first passing row plus the passing rows returned. (The
//! predicates of the change query are all "after a keyset" within a range, so
//! within a seek range they fail and then pass: one binary search finds the first
//! passing row. That is checked on the rows at the boundary.)
//!
//! Parameters are bound as the source binds them: `@P1` the page size, `@P2` the
//! upper LSN, `@P3`…`@P6` the keyset to resume after.

use std::cmp::Ordering;

use cdc_sim::SeekCost;
use mssql_ces::lsn::Lsn;
use mssql_ces::source::RowKey;
use sqlparser::ast::{BinaryOperator, Expr, SetExpr, Statement, TableFactor, Value};
use sqlparser::dialect::MsSqlDialect;
use sqlparser::parser::Parser;

/// The index's key columns, in order.
const INDEX: [&str; 4] = ["__$start_lsn", "__$command_id", "__$seqval", "__$operation"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Val {
    Lsn(Lsn),
    Int(i64),
}

fn column(key: &RowKey, at: usize) -> Val {
    match at {
        0 => Val::Lsn(key.start_lsn),
        1 => Val::Int(i64::from(key.command_id)),
        2 => Val::Lsn(key.seqval),
        _ => Val::Int(i64::from(key.operation)),
    }
}

/// What a page binds.
struct Bound<'a> {
    after: &'a RowKey,
    to: Lsn,
}

impl Bound<'_> {
    fn param(&self, n: usize) -> Option<Val> {
        Some(match n {
            2 => Val::Lsn(self.to),
            3 => Val::Lsn(self.after.start_lsn),
            4 => Val::Int(i64::from(self.after.command_id)),
            5 => Val::Lsn(self.after.seqval),
            6 => Val::Int(i64::from(self.after.operation)),
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Gt,
    GtEq,
    Lt,
    LtEq,
}

/// `<index column> <op> @Pn`.
#[derive(Debug, Clone, Copy)]
struct Comparison {
    column: usize,
    op: Op,
    param: usize,
}

#[derive(Debug, Clone)]
enum Predicate {
    Compare(Comparison),
    And(Vec<Predicate>),
    Or(Vec<Predicate>),
}

impl Predicate {
    fn holds(&self, key: &RowKey, bound: &Bound<'_>) -> bool {
        match self {
            Predicate::Compare(c) => {
                let (Some(value), left) = (bound.param(c.param), column(key, c.column)) else {
                    return false;
                };
                let ordering = left.cmp(&value);
                match c.op {
                    Op::Eq => ordering == Ordering::Equal,
                    Op::Gt => ordering == Ordering::Greater,
                    Op::GtEq => ordering != Ordering::Less,
                    Op::Lt => ordering == Ordering::Less,
                    Op::LtEq => ordering != Ordering::Greater,
                }
            }
            Predicate::And(all) => all.iter().all(|p| p.holds(key, bound)),
            Predicate::Or(any) => any.iter().any(|p| p.holds(key, bound)),
        }
    }
}

/// One `SELECT` over the change table: its seek and its whole predicate.
#[derive(Debug, Clone)]
struct Branch {
    /// Equalities on the first index columns, in order.
    equal: Vec<Comparison>,
    /// Bounds on the next column.
    lower: Option<Comparison>,
    upper: Option<Comparison>,
    predicate: Predicate,
}

impl Branch {
    fn from_predicate(predicate: Predicate) -> Self {
        let conjuncts: Vec<Comparison> = match &predicate {
            Predicate::And(all) => all
                .iter()
                .filter_map(|p| match p {
                    Predicate::Compare(c) => Some(*c),
                    _ => None,
                })
                .collect(),
            Predicate::Compare(c) => vec![*c],
            Predicate::Or(_) => Vec::new(),
        };
        let mut branch = Branch {
            equal: Vec::new(),
            lower: None,
            upper: None,
            predicate,
        };
        for at in 0..INDEX.len() {
            if let Some(eq) = conjuncts.iter().find(|c| c.column == at && c.op == Op::Eq) {
                branch.equal.push(*eq);
                continue;
            }
            branch.lower = conjuncts
                .iter()
                .find(|c| c.column == at && matches!(c.op, Op::Gt | Op::GtEq))
                .copied();
            branch.upper = conjuncts
                .iter()
                .find(|c| c.column == at && matches!(c.op, Op::Lt | Op::LtEq))
                .copied();
            break;
        }
        branch
    }

    /// How `key` compares with the equalities' values, column by column: the first
    /// that differs (`None` when all are equal, or a value is not bound).
    fn against_equalities(&self, key: &RowKey, bound: &Bound<'_>) -> Option<Ordering> {
        for eq in &self.equal {
            match column(key, eq.column).cmp(&bound.param(eq.param)?) {
                Ordering::Equal => {}
                other => return Some(other),
            }
        }
        Some(Ordering::Equal)
    }

    /// Whether `key` sorts before the seek range's start.
    fn before_start(&self, key: &RowKey, bound: &Bound<'_>) -> bool {
        match self.against_equalities(key, bound) {
            Some(Ordering::Less) => true,
            Some(Ordering::Equal) => self.lower.is_some_and(|c| match bound.param(c.param) {
                Some(v) if c.op == Op::Gt => column(key, c.column) <= v,
                Some(v) => column(key, c.column) < v,
                None => false,
            }),
            _ => false,
        }
    }

    /// Whether `key` sorts after the seek range's end.
    fn past_end(&self, key: &RowKey, bound: &Bound<'_>) -> bool {
        match self.against_equalities(key, bound) {
            Some(Ordering::Greater) => true,
            Some(Ordering::Equal) => self.upper.is_some_and(|c| match bound.param(c.param) {
                Some(v) if c.op == Op::Lt => column(key, c.column) >= v,
                Some(v) => column(key, c.column) > v,
                None => false,
            }),
            _ => false,
        }
    }

    /// Rows examined for a page of `limit` rows.
    fn examined(
        &self,
        key: &dyn Fn(usize) -> RowKey,
        len: usize,
        bound: &Bound<'_>,
        limit: usize,
    ) -> usize {
        let lo = partition_point(0, len, |i| self.before_start(&key(i), bound));
        let hi = partition_point(lo, len, |i| !self.past_end(&key(i), bound));
        let first = partition_point(lo, hi, |i| !self.predicate.holds(&key(i), bound));
        // The predicate fails and then passes within the range (see the module
        // documentation): what this model rests on, checked where it matters.
        assert!(
            first == hi || self.predicate.holds(&key(hi - 1), bound),
            "the branch's predicate is not monotone in its seek range"
        );
        (first - lo) + limit.min(hi - first)
    }
}

/// The first index in `from..to` where `before` is false (it is true, then false).
fn partition_point(from: usize, to: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (from, to);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

fn param_number(expr: &Expr) -> Option<usize> {
    let text = match expr {
        Expr::Identifier(ident) => ident.value.as_str(),
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => p.as_str(),
            _ => return None,
        },
        Expr::Nested(inner) => return param_number(inner),
        _ => return None,
    };
    text.strip_prefix("@P")?.parse().ok()
}

fn index_column(expr: &Expr) -> Option<usize> {
    let name = match expr {
        Expr::CompoundIdentifier(parts) => parts.last()?.value.as_str(),
        Expr::Identifier(ident) => ident.value.as_str(),
        _ => return None,
    };
    INDEX.iter().position(|c| *c == name)
}

fn predicate(expr: &Expr) -> Result<Predicate, String> {
    match expr {
        Expr::Nested(inner) => predicate(inner),
        Expr::BinaryOp { left, op, right } => match op {
            BinaryOperator::And => {
                let mut all = Vec::new();
                for side in [left, right] {
                    match predicate(side)? {
                        Predicate::And(inner) => all.extend(inner),
                        other => all.push(other),
                    }
                }
                Ok(Predicate::And(all))
            }
            BinaryOperator::Or => {
                let mut any = Vec::new();
                for side in [left, right] {
                    match predicate(side)? {
                        Predicate::Or(inner) => any.extend(inner),
                        other => any.push(other),
                    }
                }
                Ok(Predicate::Or(any))
            }
            comparison => {
                let op = match comparison {
                    BinaryOperator::Eq => Op::Eq,
                    BinaryOperator::Gt => Op::Gt,
                    BinaryOperator::GtEq => Op::GtEq,
                    BinaryOperator::Lt => Op::Lt,
                    BinaryOperator::LtEq => Op::LtEq,
                    other => return Err(format!("an operator the model does not know: {other}")),
                };
                let (Some(column), Some(param)) = (index_column(left), param_number(right)) else {
                    return Err(format!("a comparison the model does not know: {expr}"));
                };
                Ok(Predicate::Compare(Comparison { column, op, param }))
            }
        },
        other => Err(format!("a predicate the model does not know: {other}")),
    }
}

/// The branches of a query: every `SELECT` with a `WHERE`, through derived tables
/// and `UNION ALL`.
fn branches(body: &SetExpr, out: &mut Vec<Branch>) -> Result<(), String> {
    match body {
        SetExpr::Select(select) => {
            if let Some(selection) = &select.selection {
                out.push(Branch::from_predicate(predicate(selection)?));
                return Ok(());
            }
            for table in &select.from {
                if let TableFactor::Derived { subquery, .. } = &table.relation {
                    branches(&subquery.body, out)?;
                }
            }
            Ok(())
        }
        SetExpr::Query(query) => branches(&query.body, out),
        SetExpr::SetOperation { left, right, .. } => {
            branches(left, out)?;
            branches(right, out)
        }
        other => Err(format!("a query shape the model does not know: {other}")),
    }
}

/// The cost model of `sql`, a change query as `queries::read_changes` builds it.
pub fn change_query_cost(sql: &str) -> Result<SeekCost, String> {
    let statements = Parser::parse_sql(&MsSqlDialect {}, sql).map_err(|e| e.to_string())?;
    let Some(Statement::Query(query)) = statements.first() else {
        return Err("not a query".into());
    };
    let mut found = Vec::new();
    branches(&query.body, &mut found)?;
    if found.is_empty() {
        return Err("no branch filters the change table".into());
    }
    Ok(SeekCost::new(move |key, len, after, to, limit| {
        let bound = Bound { after, to };
        found
            .iter()
            .map(|b| b.examined(key, len, &bound, limit))
            .sum()
    }))
}
