//! The column read paths over one sealed file (see `crate::scan`): they use
//! the directory to skip what cannot match and decode as little as they can.
//!
//! - Every path first narrows each row group to row ranges: the group's time
//!   bounds, then the series that pass the tag predicates (by the
//!   per-series row ranges, so a one-series request reads only that
//!   series' row groups), then time pages by their statistics, then field
//!   pages by theirs (a column against a literal by its min and max; two
//!   arithmetic values by bounds worked out from their columns' min and
//!   max), then (lazy decode) the field predicate's columns.
//! - Rows mode decodes only the projected columns' pages that hold selected
//!   rows and appends them page by page.
//! - Aggregate mode splits the ranges into runs of one group (a time page
//!   whose min and max fall in one bucket needs no decoding) and folds each
//!   page that lies wholly inside a run from its header statistics for
//!   count, sum, avg, min and max; the rest is decoded.
//! - Last mode answers each series from the directory's last row when that
//!   row is in range and passes the filter; otherwise it reads the series'
//!   row groups newest first and stops at the first group with a match.
//! - Time-ordered mode visits row groups newest (or oldest) first and stops
//!   once no remaining group can hold a row that beats the kept ones; in a
//!   group it decodes only the newest (oldest) `limit` matching rows of each
//!   series, since no other row of the series can be in the answer.

use sealion_partial::{AggregateKind, GroupStates, SumOf, Value as PValue};

use super::value::ChunkRole;
use super::{OutBatch, PageInfo, SealedFile, Source, TagColumn, append_rows, pages_decoded};
use crate::columnar::{ColumnType, ColumnValues, Page, StatValue, Sum};
use crate::rows::{ColumnBuilder, Value, decode_fields};
use crate::scan::predicate::{Expr, Num, NumType, columnwise, compare};
use crate::scan::{AggPlan, CallSource, Metrics, Mode, Output, Query, SeriesCtx, aggregate_error};
use crate::sealed::format::series_cmp;
use crate::{Error, Result, SCAN_BATCH_ROWS};
use sealion_common::proto::ColumnKind;
use sealion_common::proto::CompareOp;

/// Row ranges `[a, b)` of one row group (group-local), each inside one
/// series (the index into `SealedFile::series`).
type Ranges = Vec<(usize, usize, usize)>;

/// Decoded pages of one row group, per chunk, filled as paths need them.
struct Decoded {
    chunks: Vec<Option<Vec<Option<Page>>>>,
}

impl Decoded {
    fn new(chunks: usize) -> Self {
        Decoded {
            chunks: (0..chunks).map(|_| None).collect(),
        }
    }
}

/// A value of a decoded page, None when null.
fn page_value(page: &Page, i: usize) -> Option<Value> {
    if page.is_null(i) {
        return None;
    }
    Some(match &page.values {
        ColumnValues::Float64(v) => Value::F64(v[i]),
        ColumnValues::Int64(v) | ColumnValues::Timestamp(v) => Value::I64(v[i]),
        ColumnValues::UInt64(v) => Value::U64(v[i]),
        ColumnValues::Bool(v) => Value::Bool(v[i]),
        ColumnValues::Text(v) => Value::Str(v[i].clone()),
    })
}

fn page_pvalue(page: &Page, i: usize) -> Option<PValue> {
    page_value(page, i).map(crate::scan::to_partial)
}

fn stat_value(v: &StatValue) -> Value {
    match v {
        StatValue::Float64(x) => Value::F64(*x),
        StatValue::Int64(x) | StatValue::Timestamp(x) => Value::I64(*x),
        StatValue::UInt64(x) => Value::U64(*x),
        StatValue::Bool(x) => Value::Bool(*x),
        StatValue::Text(x) => Value::Str(x.clone()),
    }
}

fn stat_pvalue(v: &StatValue) -> Option<PValue> {
    // A NaN's sign decides where total order puts it; states keep one
    // canonical NaN. Pages holding a NaN are decoded instead.
    if matches!(v, StatValue::Float64(x) if x.is_nan()) {
        return None;
    }
    Some(crate::scan::to_partial(stat_value(v)))
}

/// Page `p` of `infos` and the rows `[a, b)` it shares with the range, for
/// every page that overlaps `[a, b)` (group-local rows).
fn segments(
    infos: &[PageInfo],
    a: usize,
    b: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let first = infos.partition_point(|i| (i.first_row + i.rows) as usize <= a);
    segments_from(infos, first, a, b)
}

/// `segments` for ranges that mostly come in ascending order: the search
/// for the first page starts at `hint` (left at that page for the next
/// range) and walks forward, falling back to a binary search when `a` lies
/// before it.
fn segments_after<'a>(
    infos: &'a [PageInfo],
    hint: &mut usize,
    a: usize,
    b: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
    let end = |i: &PageInfo| (i.first_row + i.rows) as usize;
    if infos.get(*hint).is_none_or(|i| i.first_row as usize > a) {
        *hint = infos.partition_point(|i| end(i) <= a);
    } else {
        while infos.get(*hint).is_some_and(|i| end(i) <= a) {
            *hint += 1;
        }
    }
    segments_from(infos, *hint, a, b)
}

/// The pages from `first` on that start before `b`, each with the rows it
/// shares with `[a, b)` where `a` lies in page `first` or before it.
fn segments_from(
    infos: &[PageInfo],
    first: usize,
    a: usize,
    b: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    infos[first.min(infos.len())..]
        .iter()
        .enumerate()
        .map(move |(k, info)| (first + k, info))
        .take_while(move |(_, info)| (info.first_row as usize) < b)
        .map(move |(p, info)| {
            let lo = a.max(info.first_row as usize);
            let hi = b.min((info.first_row + info.rows) as usize);
            (p, lo, hi)
        })
}

impl SealedFile {
    /// Answers `out`'s query over this file alone: the caller has checked
    /// that no late rows or deletes are pending for it.
    pub fn run(&self, out: &mut Output<'_>) -> Result<()> {
        if self.aggregates_from_directory(out.query) {
            return self.run_directory(out);
        }
        let ctxs = self.series_ctxs(out.query, 0..self.series.len())?;
        let read = match out.query.mode {
            Mode::Rows | Mode::Aggregate(_) => Some(self.candidates(out.query, &ctxs)),
            Mode::Last { .. } | Mode::Ordered { .. } => None,
        };
        let all: Vec<usize> = (0..self.groups.len()).collect();
        self.run_in(out, &ctxs, read.as_deref(), &all, true)
    }

    /// The row groups a scan of `q` reads, in file order: those whose time
    /// bounds and series the directory cannot rule out. What a scan split
    /// across threads shares out (`run_share`).
    pub fn groups_to_read(&self, q: &Query) -> Result<Vec<usize>> {
        if self.aggregates_from_directory(q) {
            return Ok(Vec::new());
        }
        let ctxs = self.series_ctxs(q, 0..self.series.len())?;
        Ok(self.candidates(q, &ctxs))
    }

    /// At most how many row groups [`SealedFile::run`] reads to answer
    /// `out`'s query as `out` stands: what a caller weighs before running a
    /// scan where a long one would hold up other work. Cheap: it decodes no
    /// series key and reads no page, and it overcounts rather than under.
    ///
    /// An aggregate the directory answers reads none. Otherwise the groups
    /// in the time range holding a series an `IN` tag predicate leaves
    /// (each series' count summed, a group shared by two counted twice),
    /// or every group in the time range when no such predicate narrows the
    /// series. Each series' newest rows pass over a series a newer
    /// partition settled and, for one row a series with no field filter,
    /// one whose directory row is in range.
    pub fn groups_may_read(&self, out: &Output<'_>) -> usize {
        let q = out.query;
        if self.aggregates_from_directory(q) {
            return 0;
        }
        let in_time =
            |g: &&super::RowGroupInfo| g.max_time_ns >= q.start_ns && g.min_time_ns < q.end_ns;
        let Some(series) = self.in_tag_candidates(q) else {
            return self.groups.iter().filter(in_time).count();
        };
        let mut n = 0;
        for s in series {
            let info = &self.series[s];
            if info.rows == 0 {
                continue;
            }
            if let Mode::Last { rows } = q.mode {
                let from_directory = rows == 1
                    && q.filter.is_none()
                    && info.last_time_ns >= q.start_ns
                    && info.last_time_ns < q.end_ns;
                if from_directory || out.series_settled(&info.key, info.last_time_ns) {
                    continue;
                }
            }
            n += self.groups[self.groups_of_series(s)]
                .iter()
                .filter(in_time)
                .count();
        }
        n
    }

    /// The row groups holding rows of series `s` (its rows are contiguous).
    fn groups_of_series(&self, s: usize) -> std::ops::Range<usize> {
        let info = &self.series[s];
        let first = self
            .groups
            .partition_point(|g| g.first_row + u64::from(g.rows) <= info.first_row);
        let last = self
            .groups
            .partition_point(|g| g.first_row < info.first_row + info.rows);
        first..last
    }

    /// Share `share` of `shares` of a scan split across threads: answers
    /// `out`'s query over one contiguous run of `groups` (as
    /// `groups_to_read` gave them), the shares together reading each group
    /// once. Each share is a whole answer of its own rows (`Query::splits`
    /// says which queries allow it); share 0 also counts the groups no share
    /// reads, so the shares' counters sum to what `run` counts.
    pub fn run_share(
        &self,
        out: &mut Output<'_>,
        groups: &[usize],
        share: usize,
        shares: usize,
    ) -> Result<()> {
        if !out.query.splits() || share >= shares {
            return Err(Error::Internal(format!(
                "share {share} of {shares} of a scan that cannot be split"
            )));
        }
        let (a, b) = (
            groups.len() * share / shares,
            groups.len() * (share + 1) / shares,
        );
        // An aggregate the directory answers reads no group (`groups` is
        // empty): share 0 folds every series and counts every group.
        if self.aggregates_from_directory(out.query) {
            return match share {
                0 => self.run_directory(out),
                _ => Ok(()),
            };
        }
        let mine = &groups[a..b];
        // Only the series of these groups can reach the answer.
        let series = match (mine.first(), mine.last()) {
            (Some(&g0), Some(&g1)) => {
                self.groups[g0].first_key.0 as usize..self.groups[g1].last_key.0 as usize + 1
            }
            _ => 0..0,
        };
        let ctxs = self.series_ctxs(out.query, series)?;
        let mut counted = mine.to_vec();
        if share == 0 {
            let mut read = groups.iter().peekable();
            for g in 0..self.groups.len() {
                if read.next_if(|&&r| r == g).is_none() {
                    counted.push(g);
                }
            }
        }
        self.run_in(out, &ctxs, Some(mine), &counted, share == 0)
    }

    /// What each series contributes to `q`: ruled out unless it is in
    /// `series` (indexes into the directory's series) and can match.
    fn series_ctxs(&self, q: &Query, series: std::ops::Range<usize>) -> Result<Vec<SeriesCtx>> {
        let bad_key = || self.bad_key();
        let mut ctxs = vec![SeriesCtx::ruled_out(); self.series.len()];
        match point_key(q) {
            // Every tag pinned to one value (or to NULL): at most one series
            // can match, found by binary search in the per-series directory.
            Some(key) => {
                if let Ok(i) = self.series.binary_search_by(|s| series_cmp(&s.key, &key))
                    && series.contains(&i)
                {
                    ctxs[i] = q.series_ctx(&self.series[i].key).ok_or_else(bad_key)?;
                }
            }
            // A `tag IN (...)` names the only series that can pass: they
            // are looked up by value (for the predicate naming the fewest),
            // and no other series key is decoded.
            None => match self.in_tag_candidates(q) {
                Some(candidates) => {
                    for i in candidates.into_iter().filter(|i| series.contains(i)) {
                        ctxs[i] = q.series_ctx(&self.series[i].key).ok_or_else(bad_key)?;
                    }
                }
                None => {
                    for i in series {
                        ctxs[i] = q.series_ctx(&self.series[i].key).ok_or_else(bad_key)?;
                    }
                }
            },
        }
        Ok(ctxs)
    }

    /// The series that can pass `q`'s `IN` tag predicate with the fewest of
    /// them (each holds one of its values), from the file's index of tag
    /// values; None when `q` has no such predicate (or the index cannot be
    /// made).
    fn in_tag_candidates(&self, q: &Query) -> Option<Vec<usize>> {
        use crate::scan::predicate::TagTest;
        let mut fewest: Option<Vec<usize>> = None;
        for p in &q.tags {
            let TagTest::In(values) = &p.test else {
                continue;
            };
            let index = self.series_by_tag()?;
            let n: usize = values
                .iter()
                .map(|v| index.series(&p.column, v).len())
                .sum();
            if fewest.as_ref().is_some_and(|f| f.len() <= n) {
                continue;
            }
            fewest = Some(
                values
                    .iter()
                    .flat_map(|v| index.series(&p.column, v))
                    .map(|&i| i as usize)
                    .collect(),
            );
        }
        fewest
    }

    /// The groups `group_may_match` keeps, in file order.
    fn candidates(&self, q: &Query, ctxs: &[SeriesCtx]) -> Vec<usize> {
        (0..self.groups.len())
            .filter(|&g| self.group_may_match(g, q, ctxs))
            .collect()
    }

    /// Runs the path of `out`'s mode over `read` (rows and aggregate modes;
    /// the other modes choose their own order over every group) and counts
    /// the groups of `counted` that were not read and their pages that were
    /// neither decoded nor folded from statistics. `whole` adds the file's
    /// groups to `row_groups_total`.
    fn run_in(
        &self,
        out: &mut Output<'_>,
        ctxs: &[SeriesCtx],
        read: Option<&[usize]>,
        counted: &[usize],
        whole: bool,
    ) -> Result<()> {
        let before = pages_decoded();
        let from_stats_before = out.metrics.pages_from_stats.get();
        let q = out.query;
        if whole {
            Metrics::add(&out.metrics.row_groups_total, self.groups.len() as u64);
        }
        let read = read.unwrap_or_default();
        let touched = match &q.mode {
            Mode::Rows => self.run_rows(out, ctxs, read)?,
            Mode::Aggregate(_) => self.run_aggregate(out, ctxs, read)?,
            Mode::Last { rows } => self.run_last(out, ctxs, *rows)?,
            Mode::Ordered { desc } => self.run_ordered(out, ctxs, *desc)?,
        };
        let decoded = pages_decoded() - before;
        Metrics::add(&out.metrics.pages_decoded, decoded);
        Metrics::add(
            &out.metrics.row_groups_skipped,
            (counted.len() as u64).saturating_sub(touched),
        );
        let total: u64 = counted
            .iter()
            .map(|&g| {
                self.groups[g]
                    .chunks
                    .iter()
                    .map(|c| c.len() as u64)
                    .sum::<u64>()
            })
            .sum();
        Metrics::add(
            &out.metrics.pages_skipped,
            total.saturating_sub(decoded + out.metrics.pages_from_stats.get() - from_stats_before),
        );
        Ok(())
    }

    /// Whether row group `g` overlaps the query's time range and holds a
    /// series that passes the tag predicates (the directory alone decides).
    fn group_may_match(&self, g: usize, q: &crate::scan::Query, ctxs: &[SeriesCtx]) -> bool {
        let group = &self.groups[g];
        let (s0, s1) = (group.first_key.0 as usize, group.last_key.0 as usize);
        group.max_time_ns >= q.start_ns
            && group.min_time_ns < q.end_ns
            && ctxs
                .get(s0..=s1)
                .is_some_and(|c| c.iter().any(|x| x.passes))
    }

    /// Decodes the pages of chunk `c` of group `g` that overlap `ranges` and
    /// are not decoded yet.
    fn ensure(&self, g: usize, c: usize, ranges: &Ranges, dec: &mut Decoded) -> Result<()> {
        let infos = &self.groups[g].chunks[c];
        let have = dec.chunks[c].get_or_insert_with(|| (0..infos.len()).map(|_| None).collect());
        let missing: Vec<bool> = infos
            .iter()
            .zip(have.iter())
            .map(|(info, page)| {
                let (a, b) = (
                    info.first_row as usize,
                    (info.first_row + info.rows) as usize,
                );
                page.is_none() && ranges.iter().any(|&(x, y, _)| x < b && a < y)
            })
            .collect();
        if missing.iter().any(|&m| m) {
            let fresh = self.decode_pages(g, c, &missing)?;
            for (slot, page) in have.iter_mut().zip(fresh) {
                if page.is_some() {
                    *slot = page;
                }
            }
        }
        Ok(())
    }

    /// The rows of group `g` that pass the time range, the tag predicates and
    /// the field predicate, as ranges inside one series each. None when the
    /// group can be skipped without decoding anything.
    fn matching(
        &self,
        out: &Output<'_>,
        g: usize,
        ctxs: &[SeriesCtx],
    ) -> Result<Option<(Ranges, Decoded)>> {
        let q = out.query;
        let group = &self.groups[g];
        if !self.group_may_match(g, q, ctxs) {
            return Ok(None);
        }
        let (s0, s1) = (group.first_key.0 as usize, group.last_key.0 as usize);
        let (times, time_pages) = self.select(g, q.start_ns, q.end_ns)?;
        let mut dec = Decoded::new(self.specs.len());
        dec.chunks[self.time_chunk] = Some(time_pages);
        let base = group.first_row;
        let mut ranges: Ranges = Vec::new();
        // Both lists are sorted and disjoint: one merge pass intersects them.
        let mut t = 0;
        #[allow(clippy::needless_range_loop)] // `s` names the series in `ranges`
        for s in s0..=s1 {
            let info = &self.series[s];
            let a = info.first_row.saturating_sub(base) as usize;
            let b = ((info.first_row + info.rows).saturating_sub(base) as usize)
                .min(group.rows as usize);
            while t < times.len() && times[t].1 <= a {
                t += 1;
            }
            if !ctxs[s].passes {
                continue;
            }
            let mut k = t;
            while k < times.len() && times[k].0 < b {
                let (lo, hi) = (a.max(times[k].0), b.min(times[k].1));
                if lo < hi {
                    ranges.push((lo, hi, s));
                }
                k += 1;
            }
        }
        if ranges.is_empty() {
            return Ok(None);
        }
        Metrics::add(
            &out.metrics.rows_scanned,
            ranges.iter().map(|&(a, b, _)| (b - a) as u64).sum(),
        );
        let Some(filter) = &q.filter else {
            return Ok(Some((ranges, dec)));
        };
        // Pages whose statistics prove a top-level conjunct false for every
        // row (or hold only nulls, for which it is unknown) drop their rows
        // before anything is decoded.
        let conjuncts: Vec<&Expr> = match &filter.expr {
            Expr::All(terms) => terms.iter().collect(),
            e => vec![e],
        };
        for e in conjuncts {
            if let Expr::CmpValues {
                left,
                op,
                right,
                ty,
            } = e
            {
                let cut = self.values_excluded_rows(g, filter, left, *op, right, *ty)?;
                if !cut.is_empty() {
                    ranges = subtract_all(&ranges, &cut);
                }
                continue;
            }
            let Expr::Cmp { col, op, lit } = e else {
                continue;
            };
            let Source::Chunk(c) = self.source_of(&filter.columns[*col])? else {
                continue;
            };
            let cut: Vec<(usize, usize)> = group.chunks[c]
                .iter()
                .filter(|info| page_excludes(info, *op, lit))
                .map(|info| {
                    (
                        info.first_row as usize,
                        (info.first_row + info.rows) as usize,
                    )
                })
                .collect();
            if !cut.is_empty() {
                ranges = subtract_all(&ranges, &cut);
            }
        }
        if ranges.is_empty() {
            return Ok(Some((ranges, dec)));
        }
        // Lazy decode: the filter's columns first, and only for selected rows.
        let mut sources = Vec::with_capacity(filter.columns.len());
        for c in &filter.columns {
            let src = self.source_of(c)?;
            if let Source::Chunk(i) = src {
                self.ensure(g, i, &ranges, &mut dec)?;
            }
            sources.push(src);
        }
        if let Some(kept) = self.refine_by_comparisons(g, filter, &sources, &ranges, &dec)? {
            return Ok(Some((kept, dec)));
        }
        let mut kept: Ranges = Vec::new();
        let mut values: Vec<Option<Value>> = vec![None; sources.len()];
        for &(a, b, s) in &ranges {
            let mut run: Option<usize> = None;
            for row in a..b {
                for (k, src) in sources.iter().enumerate() {
                    values[k] = match *src {
                        // Field predicates name fields only (tags have their
                        // own predicates): a column not in the file is null.
                        Source::Missing | Source::Tag => None,
                        Source::Chunk(c) => self.value_in(g, c, &dec, row),
                    };
                }
                let keep = filter.keeps(&values);
                match (keep, run) {
                    (true, None) => run = Some(row),
                    (false, Some(x)) => {
                        kept.push((x, row, s));
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(x) = run {
                kept.push((x, b, s));
            }
        }
        Ok(Some((kept, dec)))
    }

    /// The rows of group `g` (sorted, disjoint `[a, b)`, adjacent runs
    /// joined) where page statistics prove `left <op> right` false or
    /// unknown: the group is cut where any of the comparison's columns
    /// starts a page, and a piece goes when one of its pages holds only
    /// nulls or when the bounds of the two values (`Num::range_f64`,
    /// `Num::range_i64`) cannot meet `op`. Empty when a column is not
    /// stored in the file's pages (a tag, or a column added after sealing).
    fn values_excluded_rows(
        &self,
        g: usize,
        filter: &crate::scan::predicate::FieldFilter,
        left: &Num,
        op: CompareOp,
        right: &Num,
        ty: NumType,
    ) -> Result<Vec<(usize, usize)>> {
        let group = &self.groups[g];
        let mut cols = Vec::new();
        left.columns(&mut cols);
        right.columns(&mut cols);
        // Per filter column read, its chunk; the pages of every chunk cover
        // the group's rows in order.
        let mut chunks: Vec<(usize, &[PageInfo])> = Vec::with_capacity(cols.len());
        for &k in &cols {
            let Source::Chunk(c) = self.source_of(&filter.columns[k])? else {
                return Ok(Vec::new());
            };
            chunks.push((k, &group.chunks[c]));
        }
        let rows = group.rows as usize;
        let mut at = vec![0usize; chunks.len()];
        let mut cut: Vec<(usize, usize)> = Vec::new();
        let mut row = 0;
        let mut f64s: Vec<Option<(f64, f64)>> = vec![None; filter.columns.len()];
        let mut i64s: Vec<Option<(i64, i64)>> = vec![None; filter.columns.len()];
        while row < rows {
            let mut hi = rows;
            let mut all_null = false;
            for ((k, pages), p) in chunks.iter().zip(at.iter_mut()) {
                while *p < pages.len() && ((pages[*p].first_row + pages[*p].rows) as usize) <= row {
                    *p += 1;
                }
                let Some(info) = pages.get(*p) else {
                    // Pages that stop short of the group's rows: nothing is
                    // proved for the rest.
                    return Ok(cut);
                };
                hi = hi.min((info.first_row + info.rows) as usize);
                all_null |= info.null_count == info.rows;
                (f64s[*k], i64s[*k]) = match (&info.min, &info.max) {
                    (Some(StatValue::Float64(a)), Some(StatValue::Float64(b))) => {
                        (Some((*a, *b)), None)
                    }
                    (Some(StatValue::Int64(a)), Some(StatValue::Int64(b))) => {
                        (None, Some((*a, *b)))
                    }
                    _ => (None, None),
                };
            }
            if hi <= row {
                return Ok(cut);
            }
            // A null in any column makes a row's comparison unknown.
            let excluded = all_null
                || crate::scan::predicate::values_excluded(
                    left,
                    op,
                    right,
                    ty,
                    |k| f64s.get(k).copied().flatten(),
                    |k| i64s.get(k).copied().flatten(),
                );
            if excluded {
                match cut.last_mut() {
                    Some(last) if last.1 == row => last.1 = hi,
                    _ => cut.push((row, hi)),
                }
            }
            row = hi;
        }
        Ok(cut)
    }

    /// The rows of `ranges` that pass `filter` when it is a conjunction of
    /// comparisons over `DOUBLE` or `BIGINT` columns: a column with a
    /// literal of its own type (the common shape: `usage_user > 90`), or
    /// two arithmetic values (`usage_user + usage_system > 150`). Each
    /// comparison runs over the decoded page values, narrowing the ranges
    /// for the next, with no value built per row. `None` for any other
    /// filter, which the row by row evaluation answers. Both give the same
    /// rows: a null or a false comparison drops a row, as
    /// `FieldFilter::keeps` does.
    fn refine_by_comparisons(
        &self,
        g: usize,
        filter: &crate::scan::predicate::FieldFilter,
        sources: &[Source],
        ranges: &Ranges,
        dec: &Decoded,
    ) -> Result<Option<Ranges>> {
        let terms: Vec<&Expr> = match &filter.expr {
            Expr::All(terms) => terms.iter().collect(),
            e => vec![e],
        };
        let chunk_of = |col: usize| match sources.get(col) {
            Some(&Source::Chunk(c)) => Some(c),
            _ => None,
        };
        let mut plan = Vec::with_capacity(terms.len());
        for t in terms {
            match t {
                Expr::Cmp { col, op, lit } => {
                    let Some(c) = chunk_of(*col) else {
                        return Ok(None);
                    };
                    let fits = matches!(
                        (self.specs[c].ty, lit),
                        (ColumnType::Float64, Value::F64(_)) | (ColumnType::Int64, Value::I64(_))
                    );
                    if !fits || *op == CompareOp::Unspecified {
                        return Ok(None);
                    }
                    plan.push(Step::Literal(c, *op, lit));
                }
                Expr::CmpValues {
                    left,
                    op,
                    right,
                    ty,
                } => {
                    let mut cols = Vec::new();
                    left.columns(&mut cols);
                    right.columns(&mut cols);
                    let want = match ty {
                        NumType::F64 => ColumnType::Float64,
                        NumType::I64 => ColumnType::Int64,
                    };
                    let mut chunks = vec![None; filter.columns.len()];
                    for &k in &cols {
                        match chunk_of(k) {
                            Some(c) if self.specs[c].ty == want => chunks[k] = Some(c),
                            _ => return Ok(None),
                        }
                    }
                    if *op == CompareOp::Unspecified {
                        return Ok(None);
                    }
                    plan.push(Step::Values {
                        left,
                        op: *op,
                        right,
                        ty: *ty,
                        chunks,
                    });
                }
                _ => return Ok(None),
            }
        }
        let pages_of = |c: usize| {
            dec.chunks[c]
                .as_deref()
                .ok_or_else(|| Error::Internal("filter pages were not decoded".into()))
        };
        let short = || Error::Corrupt {
            partition_id: self.partition_id,
            reason: format!(
                "a decoded page of {} is shorter than its directory entry",
                self.path.display()
            ),
        };
        let mut sc = Scratch::default();
        let mut kept = ranges.clone();
        for step in plan {
            let mut next: Ranges = Vec::with_capacity(kept.len());
            let mut runs = Runs::new(&mut next);
            match step {
                Step::Literal(c, op, lit) => {
                    let infos = &self.groups[g].chunks[c];
                    let pages = pages_of(c)?;
                    for &(a, b, s) in &kept {
                        for (p, lo, hi) in segments(infos, a, b) {
                            let page = pages.get(p).and_then(Option::as_ref).ok_or_else(|| {
                                Error::Internal("filter page was not decoded".into())
                            })?;
                            let i = lo - infos[p].first_row as usize;
                            let n = hi - lo;
                            sc.keep.clear();
                            sc.keep.resize(n, false);
                            match (&page.values, lit) {
                                (ColumnValues::Float64(v), Value::F64(l)) => {
                                    let v = v.get(i..i + n).ok_or_else(short)?;
                                    columnwise::compare_f64_lit(op, v, *l, &mut sc.keep);
                                }
                                (ColumnValues::Int64(v), Value::I64(l)) => {
                                    let v = v.get(i..i + n).ok_or_else(short)?;
                                    columnwise::compare_i64_lit(op, v, *l, &mut sc.keep);
                                }
                                _ => return Ok(None),
                            }
                            if let Some(nulls) = &page.nulls {
                                let nulls = nulls.get(i..i + n).ok_or_else(short)?;
                                columnwise::drop_nulls(&mut sc.keep, nulls);
                            }
                            runs.mark_all(lo, s, &sc.keep);
                        }
                        runs.end(b, s);
                    }
                }
                Step::Values {
                    left,
                    op,
                    right,
                    ty,
                    chunks,
                } => {
                    let mut cursors = Vec::with_capacity(chunks.len());
                    for c in chunks {
                        cursors.push(match c {
                            Some(c) => {
                                Some(PageCursor::new(&self.groups[g].chunks[c], pages_of(c)?))
                            }
                            None => None,
                        });
                    }
                    // Per filter column, the page holding the segment's
                    // first row and that row's index in it.
                    let mut held: Vec<Option<(&Page, usize)>> = Vec::with_capacity(cursors.len());
                    for &(a, b, s) in &kept {
                        let mut row = a;
                        while row < b {
                            // The segment: rows from `row` on that every
                            // column read holds in one decoded page.
                            let mut hi = b;
                            held.clear();
                            for cursor in cursors.iter_mut() {
                                let Some(cursor) = cursor else {
                                    held.push(None);
                                    continue;
                                };
                                let (page, i) = cursor.at(row).ok_or_else(|| {
                                    Error::Internal("filter page was not decoded".into())
                                })?;
                                hi = hi.min(row + page.len().saturating_sub(i));
                                held.push(Some((page, i)));
                            }
                            if hi <= row {
                                return Err(short());
                            }
                            let n = hi - row;
                            sc.keep.clear();
                            sc.keep.resize(n, false);
                            let evaluated = match ty {
                                NumType::F64 => {
                                    let cols: Vec<Option<&[f64]>> = held
                                        .iter()
                                        .map(|h| match h {
                                            Some((page, i)) => match &page.values {
                                                ColumnValues::Float64(v) => v.get(*i..*i + n),
                                                _ => None,
                                            },
                                            None => None,
                                        })
                                        .collect();
                                    columnwise::compare_values_f64(
                                        left,
                                        op,
                                        right,
                                        &cols,
                                        &mut sc.keep,
                                        &mut sc.f,
                                    )
                                }
                                NumType::I64 => {
                                    let cols: Vec<Option<&[i64]>> = held
                                        .iter()
                                        .map(|h| match h {
                                            Some((page, i)) => match &page.values {
                                                ColumnValues::Int64(v) => v.get(*i..*i + n),
                                                _ => None,
                                            },
                                            None => None,
                                        })
                                        .collect();
                                    columnwise::compare_values_i64(
                                        left,
                                        op,
                                        right,
                                        &cols,
                                        &mut sc.keep,
                                        &mut sc.i,
                                    )
                                }
                            };
                            if !evaluated {
                                // A page of another type than its column's:
                                // the row by row evaluation decides.
                                return Ok(None);
                            }
                            for (page, i) in held.iter().flatten() {
                                if let Some(nulls) = &page.nulls {
                                    let nulls = nulls.get(*i..*i + n).ok_or_else(short)?;
                                    columnwise::drop_nulls(&mut sc.keep, nulls);
                                }
                            }
                            runs.mark_all(row, s, &sc.keep);
                            row = hi;
                        }
                        runs.end(b, s);
                    }
                }
            }
            kept = next;
            if kept.is_empty() {
                break;
            }
        }
        Ok(Some(kept))
    }

    /// The value of group-local `row` in chunk `c`, from decoded pages.
    fn value_in(&self, g: usize, c: usize, dec: &Decoded, row: usize) -> Option<Value> {
        let infos = &self.groups[g].chunks[c];
        let p = infos.partition_point(|i| (i.first_row + i.rows) as usize <= row);
        let page = dec.chunks[c].as_ref()?.get(p)?.as_ref()?;
        page_value(page, row - infos[p].first_row as usize)
    }

    /// Rows mode: projected columns of the matching rows of `groups`, in
    /// file order.
    fn run_rows(&self, out: &mut Output<'_>, ctxs: &[SeriesCtx], groups: &[usize]) -> Result<u64> {
        let q = out.query;
        let sources: Vec<Source> = q
            .projection
            .iter()
            .map(|c| self.source_of(c))
            .collect::<Result<_>>()?;
        let any_tag = sources.iter().any(|s| matches!(s, Source::Tag));
        let mut batch = OutBatch::new(&q.projection);
        let mut touched = 0;
        for &g in groups {
            if out.done() {
                break;
            }
            let Some((ranges, mut dec)) = self.matching(out, g, ctxs)? else {
                continue;
            };
            touched += 1;
            for s in &sources {
                if let Source::Chunk(c) = *s {
                    self.ensure(g, c, &ranges, &mut dec)?;
                }
            }
            for &(a, b, series) in &ranges {
                let tags = if any_tag {
                    self.series_tags(series)?
                } else {
                    Vec::new()
                };
                let mut a = a;
                while a < b {
                    let room = out.room().saturating_sub(batch.rows as u64);
                    if room == 0 {
                        break;
                    }
                    let take = (SCAN_BATCH_ROWS - batch.rows).min(b - a).min(room as usize);
                    for (k, s) in sources.iter().enumerate() {
                        match *s {
                            // Every range lies in one series: its tags are
                            // constant over the range.
                            Source::Tag => {
                                let name = &q.projection[k].name;
                                match (&mut batch.builders[k], tags.iter().find(|(n, _)| n == name))
                                {
                                    (ColumnBuilder::Str(b), Some((_, v))) => {
                                        (0..take).for_each(|_| b.append_value(v));
                                    }
                                    (builder, _) => builder.append_nulls(take),
                                }
                            }
                            Source::Missing => batch.builders[k].append_nulls(take),
                            Source::Chunk(c) => {
                                let pages = dec.chunks[c].as_deref().unwrap_or_default();
                                append_rows(
                                    &mut batch.builders[k],
                                    &self.groups[g].chunks[c],
                                    pages,
                                    a,
                                    a + take,
                                )
                                .map_err(|e| Error::Internal(format!("sealed scan: {e}")))?;
                            }
                        }
                    }
                    batch.rows += take;
                    Metrics::add(&out.metrics.rows_matched, take as u64);
                    a += take;
                    if batch.rows == SCAN_BATCH_ROWS || out.room() <= batch.rows as u64 {
                        out.emit_rows_batch(batch.finish()?)?;
                        if out.done() {
                            return Ok(touched);
                        }
                    }
                }
            }
        }
        if batch.rows > 0 {
            out.emit_rows_batch(batch.finish()?)?;
        }
        Ok(touched)
    }

    /// Aggregate mode over `groups`.
    fn run_aggregate(
        &self,
        out: &mut Output<'_>,
        ctxs: &[SeriesCtx],
        groups: &[usize],
    ) -> Result<u64> {
        let q = out.query;
        let Mode::Aggregate(plan) = &q.mode else {
            return Err(Error::Internal("not an aggregate scan".into()));
        };
        let mut touched = 0;
        // Pages folded from statistics, each counted once however many
        // calls used it.
        let mut folded: std::collections::HashSet<(usize, usize, usize)> = Default::default();
        out.reserve_groups(self.groups_expected(plan, q, ctxs));
        // Runs of rows in one group: (a, b, series, group index); and per
        // call the segments of those runs still to read from pages and
        // their row ranges. Kept across row groups, so they grow once.
        let mut runs: Vec<(usize, usize, usize, usize)> = Vec::new();
        let mut segs: Vec<(usize, usize, usize, usize)> = Vec::new();
        let mut wanted: Ranges = Vec::new();
        for &g in groups {
            if out.done() {
                break;
            }
            let Some((ranges, mut dec)) = self.matching(out, g, ctxs)? else {
                continue;
            };
            touched += 1;
            if ranges.is_empty() {
                continue;
            }
            Metrics::add(
                &out.metrics.rows_matched,
                ranges.iter().map(|&(a, b, _)| (b - a) as u64).sum(),
            );
            runs.clear();
            let time_infos = &self.groups[g].chunks[self.time_chunk];
            for &(a, b, s) in &ranges {
                if plan.width_ns == 0 {
                    runs.push((a, b, s, out.group_of_bucket(0, &ctxs[s])?));
                    continue;
                }
                for (p, lo, hi) in segments(time_infos, a, b) {
                    let info = &time_infos[p];
                    if let (Some(StatValue::Timestamp(t0)), Some(StatValue::Timestamp(t1))) =
                        (&info.min, &info.max)
                    {
                        // The page may hold rows outside the selection whose
                        // bucket is out of range: only a clean proof counts.
                        if let (Ok(b0), Ok(b1)) = (plan.bucket(*t0), plan.bucket(*t1))
                            && b0 == b1
                        {
                            runs.push((lo, hi, s, out.group_of_bucket(b0, &ctxs[s])?));
                            continue;
                        }
                    }
                    self.ensure(g, self.time_chunk, &vec![(lo, hi, s)], &mut dec)?;
                    let page = dec.chunks[self.time_chunk]
                        .as_ref()
                        .and_then(|c| c[p].as_ref())
                        .ok_or_else(|| Error::Internal("time page was not decoded".into()))?;
                    let ColumnValues::Timestamp(times) = &page.values else {
                        return Err(Error::Internal("time page is not timestamps".into()));
                    };
                    let off = info.first_row as usize;
                    let mut start = lo;
                    let mut current = plan.bucket(times[lo - off])?;
                    // Times of a series ascend: a row still before the
                    // bucket's end is in it, no division needed.
                    let width = i128::from(plan.width_ns);
                    let mut end = i128::from(current) + width;
                    for row in lo + 1..hi {
                        let t = times[row - off];
                        if i128::from(t) < end && t >= current {
                            continue;
                        }
                        // Most often the row opens the next bucket: no
                        // division either.
                        let bucket = match i64::try_from(end) {
                            Ok(next) if t >= next && i128::from(t) < end + width => next,
                            _ => plan.bucket(t)?,
                        };
                        if bucket != current {
                            runs.push((start, row, s, out.group_of_bucket(current, &ctxs[s])?));
                            start = row;
                            current = bucket;
                            end = i128::from(current) + width;
                        }
                    }
                    runs.push((start, hi, s, out.group_of_bucket(current, &ctxs[s])?));
                }
            }
            for (i, call) in plan.calls.iter().enumerate() {
                match &call.source {
                    CallSource::Star => {
                        for &(a, b, _, grp) in &runs {
                            let st = out.call_states(i).ok_or_else(no_group)?;
                            fold_summary(st, grp, (b - a) as u64, None, None, None)?;
                        }
                    }
                    CallSource::Tag(_) => {
                        for &(a, b, s, grp) in &runs {
                            let Some(tag) = ctxs[s].call_tags.get(i).cloned().flatten() else {
                                continue;
                            };
                            let v = PValue::Str(tag);
                            let st = out.call_states(i).ok_or_else(no_group)?;
                            match call.kind {
                                AggregateKind::Count | AggregateKind::Min | AggregateKind::Max => {
                                    fold_summary(st, grp, (b - a) as u64, None, Some(&v), Some(&v))?
                                }
                                _ => {
                                    // First/last need each row's time; the rest
                                    // take the value once per row.
                                    let all: Ranges = vec![(a, b, s)];
                                    self.ensure(g, self.time_chunk, &all, &mut dec)?;
                                    for row in a..b {
                                        let t = self.time_at(g, &dec, row)?;
                                        let st = out.call_states(i).ok_or_else(no_group)?;
                                        st.update(grp, t, &v).map_err(aggregate_error)?;
                                    }
                                }
                            }
                        }
                    }
                    CallSource::Time => {
                        self.ensure(g, self.time_chunk, &ranges, &mut dec)?;
                        for &(a, b, _, grp) in &runs {
                            for row in a..b {
                                let t = self.time_at(g, &dec, row)?;
                                let st = out.call_states(i).ok_or_else(no_group)?;
                                st.update(grp, t, &PValue::I64(t))
                                    .map_err(aggregate_error)?;
                            }
                        }
                    }
                    CallSource::Field(col) => {
                        let Source::Chunk(c) = self.source_of(col)? else {
                            continue; // not in this file: all null
                        };
                        let summarizable = matches!(
                            call.kind,
                            AggregateKind::Count
                                | AggregateKind::Sum
                                | AggregateKind::Avg
                                | AggregateKind::Min
                                | AggregateKind::Max
                        );
                        let needs_time =
                            matches!(call.kind, AggregateKind::First | AggregateKind::Last);
                        let infos = &self.groups[g].chunks[c];
                        // Pages wholly inside a run fold from their statistics
                        // when the kind allows; the other segments are read
                        // from pages decoded once, all together.
                        segs.clear();
                        wanted.clear();
                        let mut hint = 0;
                        for &(a, b, s, grp) in &runs {
                            for (p, lo, hi) in segments_after(infos, &mut hint, a, b) {
                                let info = &infos[p];
                                let whole = lo == info.first_row as usize
                                    && hi == (info.first_row + info.rows) as usize;
                                if summarizable
                                    && whole
                                    && dec.chunks[c].as_ref().is_none_or(|d| d[p].is_none())
                                {
                                    let st = out.call_states(i).ok_or_else(no_group)?;
                                    if self.fold_page_stats(g, c, p, st, grp)? {
                                        folded.insert((g, c, p));
                                        continue;
                                    }
                                }
                                segs.push((p, lo, hi, grp));
                                wanted.push((lo, hi, s));
                            }
                        }
                        if segs.is_empty() {
                            continue;
                        }
                        self.ensure(g, c, &wanted, &mut dec)?;
                        if needs_time {
                            self.ensure(g, self.time_chunk, &wanted, &mut dec)?;
                        }
                        let pages = dec.chunks[c]
                            .as_deref()
                            .ok_or_else(|| Error::Internal("pages were not decoded".into()))?;
                        for &(p, lo, hi, grp) in &segs {
                            let page = pages[p]
                                .as_ref()
                                .ok_or_else(|| Error::Internal("page was not decoded".into()))?;
                            let off = infos[p].first_row as usize;
                            let st = out.call_states(i).ok_or_else(no_group)?;
                            if needs_time {
                                for row in lo..hi {
                                    if let Some(v) = page_pvalue(page, row - off) {
                                        st.update(grp, self.time_at(g, &dec, row)?, &v)
                                            .map_err(aggregate_error)?;
                                    }
                                }
                                continue;
                            }
                            match (&page.values, &page.nulls) {
                                // The common cases: the run fed at once (the
                                // same state as value by value).
                                (ColumnValues::Float64(v), None) => st
                                    .update_f64s(grp, &v[lo - off..hi - off])
                                    .map_err(aggregate_error)?,
                                (ColumnValues::Int64(v), None) => st
                                    .update_i64s(grp, &v[lo - off..hi - off])
                                    .map_err(aggregate_error)?,
                                _ => {
                                    for row in lo..hi {
                                        if let Some(v) = page_pvalue(page, row - off) {
                                            st.update(grp, 0, &v).map_err(aggregate_error)?;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Metrics::add(&out.metrics.pages_from_stats, folded.len() as u64);
        Ok(touched)
    }

    /// Whether the directory alone answers aggregate `q` over this file:
    /// every row of the file is in the time range (and, when bucketed, in
    /// one bucket), no field predicate, and every call is `count(*)` or a
    /// count, min or max of a tag. Each passing series then adds its row
    /// count (and its tag value) to its group, and no row group is read.
    fn aggregates_from_directory(&self, q: &Query) -> bool {
        let Mode::Aggregate(plan) = &q.mode else {
            return false;
        };
        let (lo, hi) = (self.summary.min_time_ns, self.summary.max_time_ns);
        if q.filter.is_some() || self.summary.rows == 0 || lo < q.start_ns || hi >= q.end_ns {
            return false;
        }
        if plan.width_ns > 0
            && !matches!((plan.bucket(lo), plan.bucket(hi)), (Ok(a), Ok(b)) if a == b)
        {
            return false;
        }
        plan.calls.iter().all(|c| match c.source {
            CallSource::Star => true,
            CallSource::Tag(_) => matches!(
                c.kind,
                AggregateKind::Count | AggregateKind::Min | AggregateKind::Max
            ),
            CallSource::Time | CallSource::Field(_) => false,
        })
    }

    /// The error of a series key in the directory that does not decode.
    fn bad_key(&self) -> Error {
        Error::Corrupt {
            partition_id: self.partition_id,
            reason: format!("bad series key in the directory of {}", self.path.display()),
        }
    }

    /// Answers an aggregate the directory answers (`aggregates_from_directory`
    /// must hold) over the whole file, counting what `run_in` would: every
    /// row group skipped, every page neither decoded nor folded.
    fn run_directory(&self, out: &mut Output<'_>) -> Result<()> {
        let Mode::Aggregate(plan) = &out.query.mode else {
            return Err(Error::Internal("not an aggregate scan".into()));
        };
        let n = self.groups.len() as u64;
        Metrics::add(&out.metrics.row_groups_total, n);
        Metrics::add(&out.metrics.row_groups_skipped, n);
        Metrics::add(&out.metrics.pages_skipped, self.pages);
        self.aggregate_directory(out, plan)
    }

    /// Folds every passing series of the file into its group from the
    /// directory. Each series' tags are read from the file's decoded tags
    /// (`series_by_tag`), each tag predicate is asked once per distinct
    /// value, and series with the same values of the group tags and the
    /// calls' tags are added up before they reach the answer, so a group's
    /// values are looked up once per file, not once per series.
    fn aggregate_directory(&self, out: &mut Output<'_>, plan: &AggPlan) -> Result<()> {
        let q = out.query;
        let index = self.series_by_tag().ok_or_else(|| self.bad_key())?;
        let bucket = match plan.width_ns {
            0 => 0,
            _ => plan.bucket(self.summary.min_time_ns)?,
        };
        let mut passes: Vec<bool> = self.series.iter().map(|s| s.rows > 0).collect();
        for p in &q.tags {
            match index.column(&p.column) {
                // No series of the file has the tag: every value is NULL.
                None => {
                    if !p.matches(None) {
                        passes.fill(false);
                    }
                }
                Some(column) => {
                    let of_value: Vec<bool> =
                        column.values().iter().map(|v| p.matches(Some(v))).collect();
                    let of_null = p.matches(None);
                    for (pass, &id) in passes.iter_mut().zip(column.ids()) {
                        *pass &= match id {
                            TagColumn::NULL => of_null,
                            id => of_value[id as usize],
                        };
                    }
                }
            }
        }
        // The tags a series' share depends on: the group tags, then the
        // tag of each call over a tag.
        let columns: Vec<Option<&TagColumn>> = plan
            .group_tags
            .iter()
            .map(|t| index.column(t))
            .chain(plan.calls.iter().filter_map(|c| match &c.source {
                CallSource::Tag(t) => Some(index.column(t)),
                _ => None,
            }))
            .collect();
        // Per distinct list of those tags' value ids (in the order series
        // first show it), the rows of its passing series: one list when no
        // tag matters, found by the value id when one does, by a map of
        // the lists when more do.
        let width = columns.len();
        let id_of = |c: usize, s: usize| columns[c].map_or(TagColumn::NULL, |c| c.ids()[s]);
        let mut lists: Vec<u32> = Vec::new();
        let mut rows: Vec<u64> = Vec::new();
        let mut by_id: Vec<u32> = match (width, columns.first()) {
            // One slot per value and one for NULL.
            (1, Some(Some(c))) => vec![u32::MAX; c.values().len() + 1],
            _ => vec![u32::MAX; 1],
        };
        let mut seen: rustc_hash::FxHashMap<Vec<u32>, u32> = Default::default();
        let mut key: Vec<u32> = Vec::with_capacity(width);
        let mut matched = 0;
        for (s, info) in self.series.iter().enumerate() {
            if !passes[s] {
                continue;
            }
            matched += info.rows;
            // The slot of `by_id` that holds the series' list (at most one
            // tag), or None: the list is found in `seen` by `key`.
            let slot = match width {
                0 => Some(0),
                1 => Some(match id_of(0, s) {
                    TagColumn::NULL => by_id.len() - 1,
                    id => id as usize,
                }),
                _ => {
                    key.clear();
                    key.extend((0..width).map(|c| id_of(c, s)));
                    None
                }
            };
            let found = match slot {
                Some(i) => by_id[i],
                None => seen.get(&key).copied().unwrap_or(u32::MAX),
            };
            let list = match found {
                u32::MAX => {
                    let new = u32::try_from(rows.len()).map_err(|_| no_group())?;
                    match slot {
                        Some(i) => by_id[i] = new,
                        None => {
                            seen.insert(key.clone(), new);
                        }
                    }
                    lists.extend((0..width).map(|c| id_of(c, s)));
                    rows.push(0);
                    new
                }
                list => list,
            };
            rows[list as usize] += info.rows;
        }
        // Scanned as the row groups' walk counted them, none decoded.
        Metrics::add(&out.metrics.rows_scanned, matched);
        Metrics::add(&out.metrics.rows_matched, matched);
        let value = |c: usize, id: u32| columns[c].and_then(|column| column.value(id));
        let groups = plan.group_tags.len();
        let mut values: Vec<Option<&str>> = Vec::with_capacity(groups);
        for (l, &n) in rows.iter().enumerate() {
            if out.done() {
                break;
            }
            let ids = &lists[l * width..(l + 1) * width];
            values.clear();
            values.extend((0..groups).map(|c| value(c, ids[c])));
            let grp = out.group_of_tags(bucket, &values)?;
            let mut tag_column = groups;
            for (i, call) in plan.calls.iter().enumerate() {
                let tag = match &call.source {
                    CallSource::Star => None,
                    CallSource::Tag(_) => {
                        let v = value(tag_column, ids[tag_column]);
                        tag_column += 1;
                        match v {
                            Some(v) => Some(PValue::Str(v.to_string())),
                            None => continue, // NULL: not counted
                        }
                    }
                    CallSource::Time | CallSource::Field(_) => {
                        return Err(Error::Internal("a call the directory cannot answer".into()));
                    }
                };
                let st = out.call_states(i).ok_or_else(no_group)?;
                fold_summary(st, grp, n, None, tag.as_ref(), tag.as_ref())?;
            }
        }
        Ok(())
    }

    /// About how many groups an aggregate over this file makes: the distinct
    /// group-tag values of the series that pass, times the buckets between
    /// the file's (or the query's) first and last time; never more than the
    /// rows of those series (each group holds one at least).
    fn groups_expected(&self, plan: &AggPlan, q: &Query, ctxs: &[SeriesCtx]) -> usize {
        let passing = || ctxs.iter().zip(&self.series).filter(|(c, _)| c.passes);
        let rows: u64 = passing().map(|(_, s)| s.rows).sum();
        let groups: std::collections::HashSet<&Vec<Option<String>>> =
            passing().map(|(c, _)| &c.group).collect();
        let buckets = if plan.width_ns > 0 {
            let from = i128::from(self.summary.min_time_ns.max(q.start_ns));
            let to = i128::from(self.summary.max_time_ns.min(q.end_ns.saturating_sub(1)));
            ((to - from).max(0) / i128::from(plan.width_ns) + 2)
                .try_into()
                .unwrap_or(usize::MAX)
        } else {
            1
        };
        groups
            .len()
            .saturating_mul(buckets)
            .min(usize::try_from(rows).unwrap_or(usize::MAX))
    }

    /// Folds page `p` of chunk `c` of group `g` into `state` from the page's
    /// statistics alone; false when they do not suffice (a NaN, text whose
    /// min or max was too long to keep, a kind that needs the values).
    fn fold_page_stats(
        &self,
        g: usize,
        c: usize,
        p: usize,
        states: &mut GroupStates,
        group: usize,
    ) -> Result<bool> {
        let info = &self.groups[g].chunks[c][p];
        let count = u64::from(info.rows - info.null_count);
        if count == 0 {
            return Ok(true);
        }
        let (min, max) = match (&info.min, &info.max) {
            (Some(lo), Some(hi)) => (stat_pvalue(lo), stat_pvalue(hi)),
            _ => (None, None),
        };
        let sum = match states.kind() {
            AggregateKind::Sum | AggregateKind::Avg => {
                // The directory keeps min and max; the sum is in the page
                // header, read without decoding the payload.
                let stats = self.page_header_stats(g, c, p)?;
                match stats.sum {
                    Some(Sum::Int(x)) => Some(SumOf::Int(x)),
                    Some(Sum::UInt(x)) => Some(SumOf::UInt(x)),
                    // A page's float sum is a plain loop; a state adds value by
                    // value with compensation. The answer must not depend on
                    // the path, so float sums are decoded.
                    _ => return Ok(false),
                }
            }
            _ => None,
        };
        let need_extremes = matches!(states.kind(), AggregateKind::Min | AggregateKind::Max);
        if need_extremes && (min.is_none() || max.is_none()) {
            return Ok(false);
        }
        fold_summary(states, group, count, sum, min.as_ref(), max.as_ref())?;
        Ok(true)
    }

    /// The statistics in a page's header (which hold its sum), read without
    /// decompressing or decoding its payload.
    fn page_header_stats(
        &self,
        g: usize,
        c: usize,
        p: usize,
    ) -> Result<crate::columnar::PageStats> {
        use std::os::unix::fs::FileExt;
        let info = &self.groups[g].chunks[c][p];
        let mut buf = vec![0u8; info.length as usize];
        self.file.read_exact_at(&mut buf, info.offset)?;
        crate::columnar::page_stats(&buf).map_err(|e| self.page_error(g, c, p, e))
    }

    fn time_at(&self, g: usize, dec: &Decoded, row: usize) -> Result<i64> {
        match self.value_in(g, self.time_chunk, dec, row) {
            Some(Value::I64(t)) => Ok(t),
            _ => Err(Error::Internal("time page was not decoded".into())),
        }
    }

    /// Last mode.
    fn run_last(&self, out: &mut Output<'_>, ctxs: &[SeriesCtx], rows: usize) -> Result<u64> {
        let q = out.query;
        let mut touched = std::collections::BTreeSet::new();
        let mut pending = Vec::new();
        for (s, info) in self.series.iter().enumerate() {
            if out.done() {
                break;
            }
            let ctx = &ctxs[s];
            if !ctx.passes || info.rows == 0 {
                continue;
            }
            // Settled by a newer partition read before this file: none of
            // the series' rows here can enter the answer.
            if out.series_settled(&info.key, info.last_time_ns) {
                Metrics::add(&out.metrics.series_settled_before, 1);
                continue;
            }
            // The directory holds each series' last row: it answers for
            // one row per series.
            if rows == 1 && self.push_directory_last(out, s, ctx)? {
                continue;
            }
            pending.push(s);
        }
        // Series the directory could not answer: their row groups newest
        // first, each group's matching ranges found once for all of its
        // pending series; a series is settled once the newest groups gave it
        // `rows` matches.
        let mut by_group: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for &s in &pending {
            for g in self.groups_of_series(s) {
                by_group.entry(g).or_default().push(s);
            }
        }
        // How many matching rows each pending series still lacks; only the
        // pages of the newest such rows of each group are decoded.
        let mut need = vec![0usize; self.series.len()];
        for &s in &pending {
            need[s] = rows;
        }
        let fields = self.kept_fields(q);
        for (&g, series) in by_group.iter().rev() {
            if out.done() {
                break;
            }
            let group = &self.groups[g];
            if group.max_time_ns < q.start_ns || group.min_time_ns >= q.end_ns {
                continue;
            }
            if series.iter().all(|&s| need[s] == 0) {
                continue;
            }
            let Some((ranges, mut dec)) = self.matching(out, g, ctxs)? else {
                continue;
            };
            touched.insert(g);
            // A range's rows pass every filter and ascend in time: each
            // series takes what it lacks from the end of its last ranges.
            let mut picked: Ranges = Vec::new();
            for &(a, b, s) in ranges.iter().rev() {
                let take = need[s].min(b - a);
                if take > 0 {
                    picked.push((b - take, b, s));
                    need[s] -= take;
                }
            }
            if picked.is_empty() {
                continue;
            }
            picked.reverse();
            self.ensure_rows(g, &fields, &picked, &mut dec)?;
            for &(a, b, s) in &picked {
                for row in a..b {
                    let t = self.time_at(g, &dec, row)?;
                    self.push_decoded(out, ctxs, (g, &dec, &fields), (s, row, t))?;
                }
            }
        }
        Ok(touched.len() as u64)
    }

    /// For a newest-first LIMIT 1: hands `out` the directory's last row of
    /// every passing series that it settles (in the time range, kept by the
    /// field filter) and returns `ctxs` with those series ruled out, so that
    /// only the others are looked for in the row groups.
    fn ordered_from_directory(
        &self,
        out: &mut Output<'_>,
        ctxs: &[SeriesCtx],
    ) -> Result<Vec<SeriesCtx>> {
        let mut rest = ctxs.to_vec();
        for (s, info) in self.series.iter().enumerate() {
            if !ctxs[s].passes || info.rows == 0 {
                continue;
            }
            if let Some((_, cut)) = out.ordered_cutoff()
                && info.last_time_ns < cut
            {
                // Cannot beat the row kept; no older row of it can either.
                rest[s] = SeriesCtx::ruled_out();
                continue;
            }
            if self.push_directory_last(out, s, &ctxs[s])? {
                rest[s] = SeriesCtx::ruled_out();
            }
        }
        Ok(rest)
    }

    /// Hands `out` series `s`'s last row from the directory when that row
    /// is the series' newest matching one (in the time range, kept by the
    /// field filter); returns whether it did. No page is decoded.
    fn push_directory_last(&self, out: &mut Output<'_>, s: usize, ctx: &SeriesCtx) -> Result<bool> {
        let q = out.query;
        let info = &self.series[s];
        if info.last_time_ns < q.start_ns || info.last_time_ns >= q.end_ns {
            return Ok(false);
        }
        if let Some(f) = &q.filter {
            let fields =
                decode_fields(&info.last_value, &q.table).ok_or_else(|| Error::Corrupt {
                    partition_id: self.partition_id,
                    reason: format!("bad last row in the directory of {}", self.path.display()),
                })?;
            if !f.keeps(&crate::scan::filter_values(f, &fields)) {
                return Ok(false);
            }
        }
        Metrics::add(&out.metrics.last_points_from_directory, 1);
        Metrics::add(&out.metrics.rows_scanned, 1);
        out.push_row(
            self.partition_id,
            &info.key,
            ctx,
            info.last_time_ns,
            &info.last_value,
            None,
        )?;
        Ok(true)
    }

    /// Time-ordered mode.
    fn run_ordered(&self, out: &mut Output<'_>, ctxs: &[SeriesCtx], desc: bool) -> Result<u64> {
        let q = out.query;
        // The newest row of the file is the newest of its series' newest
        // rows: a series whose last row (in the directory) lies in the time
        // range and passes the field filter offers that row and nothing else
        // to a newest-first LIMIT 1. Only the other series are scanned.
        let answered;
        let ctxs = if desc && q.limit == 1 {
            answered = self.ordered_from_directory(out, ctxs)?;
            &answered[..]
        } else {
            ctxs
        };
        let mut order: Vec<usize> = (0..self.groups.len()).collect();
        if desc {
            order.sort_by_key(|&g| std::cmp::Reverse(self.groups[g].max_time_ns));
        } else {
            order.sort_by_key(|&g| self.groups[g].min_time_ns);
        }
        let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
        let fields = self.kept_fields(q);
        let mut touched = 0;
        for g in order {
            if out.done() {
                break;
            }
            let group = &self.groups[g];
            if let Some((_, cut)) = out.ordered_cutoff() {
                // Groups come in the order of their best time: once one
                // cannot beat the kept rows, none of the rest can.
                if (desc && group.max_time_ns < cut) || (!desc && group.min_time_ns > cut) {
                    break;
                }
            }
            let Some((ranges, mut dec)) = self.matching(out, g, ctxs)? else {
                continue;
            };
            touched += 1;
            // Every row of a range passed the filters, and a range's times
            // ascend: only its newest (oldest) `limit` rows can be among the
            // answer. Only their pages are decoded.
            let picked: Ranges = ranges
                .iter()
                .map(|&(a, b, s)| {
                    if desc {
                        (a.max(b.saturating_sub(limit)), b, s)
                    } else {
                        (a, b.min(a.saturating_add(limit)), s)
                    }
                })
                .collect();
            self.ensure_rows(g, &fields, &picked, &mut dec)?;
            for &(a, b, s) in &picked {
                let rows: Box<dyn Iterator<Item = usize>> = if desc {
                    Box::new((a..b).rev())
                } else {
                    Box::new(a..b)
                };
                for row in rows {
                    let t = self.time_at(g, &dec, row)?;
                    if let Some((_, cut)) = out.ordered_cutoff()
                        && ((desc && t < cut) || (!desc && t > cut))
                    {
                        // Later rows of this range are further still.
                        break;
                    }
                    self.push_decoded(out, ctxs, (g, &dec, &fields), (s, row, t))?;
                }
            }
        }
        Ok(touched)
    }

    /// The field chunks a row kept by the time-ordered and last-point
    /// paths takes its value from: the projected ones. The rows already
    /// passed the filter, and the answer is built from the projected
    /// columns alone (a field missing from a kept value is read as null
    /// only where it is not projected), so the other fields' pages stay
    /// encoded.
    fn kept_fields(&self, q: &Query) -> Vec<usize> {
        (0..self.specs.len())
            .filter(|&c| {
                self.specs[c].role == ChunkRole::Field
                    && q.projection.iter().any(|p| p.name == self.specs[c].name)
            })
            .collect()
    }

    /// Decodes the time pages and the field pages `fields` of group `g`
    /// that hold the rows of `picked`.
    fn ensure_rows(
        &self,
        g: usize,
        fields: &[usize],
        picked: &Ranges,
        dec: &mut Decoded,
    ) -> Result<()> {
        self.ensure(g, self.time_chunk, picked, dec)?;
        for &c in fields {
            self.ensure(g, c, picked, dec)?;
        }
        Ok(())
    }

    /// Hands `out` row `row` of series `s` at time `t`, its value built
    /// from the decoded pages of group `g`'s field chunks `fields`.
    fn push_decoded(
        &self,
        out: &mut Output<'_>,
        ctxs: &[SeriesCtx],
        (g, dec, fields): (usize, &Decoded, &[usize]),
        (s, row, t): (usize, usize, i64),
    ) -> Result<()> {
        let value = self.row_value(g, dec, fields, row)?;
        out.push_row(
            self.partition_id,
            &self.series[s].key,
            &ctxs[s],
            t,
            &value,
            None,
        )
    }

    /// Group-local `row` in the row format's value encoding, from the
    /// decoded pages of the field chunks `fields`.
    fn row_value(&self, g: usize, dec: &Decoded, fields: &[usize], row: usize) -> Result<Vec<u8>> {
        let mut value = Vec::new();
        super::value::start_value(&mut value);
        for &c in fields {
            let infos = &self.groups[g].chunks[c];
            let p = infos.partition_point(|i| (i.first_row + i.rows) as usize <= row);
            let page = dec.chunks[c]
                .as_ref()
                .and_then(|d| d.get(p))
                .and_then(|p| p.as_ref())
                .ok_or_else(|| Error::Internal("field page was not decoded".into()))?;
            if let Some(v) = super::field_ref(page, row - infos[p].first_row as usize) {
                super::value::put_field(&mut value, &self.specs[c].name, v);
            }
        }
        Ok(value)
    }
}

/// Scratch buffers of [`SealedFile::refine_by_comparisons`], kept from one
/// page segment to the next.
#[derive(Default)]
struct Scratch {
    keep: Vec<bool>,
    f: columnwise::Scratch<f64>,
    i: columnwise::Scratch<i64>,
}

/// One comparison of [`SealedFile::refine_by_comparisons`]'s plan.
enum Step<'a> {
    /// Chunk `c` against a literal.
    Literal(usize, CompareOp, &'a Value),
    /// Two values; `chunks[k]` is the chunk of filter column `k` when the
    /// values read it.
    Values {
        left: &'a Num,
        op: CompareOp,
        right: &'a Num,
        ty: NumType,
        chunks: Vec<Option<usize>>,
    },
}

/// Collects kept rows into ranges: rows are marked in ascending order
/// within a range, and `end` closes the range's open run.
struct Runs<'a> {
    out: &'a mut Ranges,
    run: Option<usize>,
}

impl<'a> Runs<'a> {
    fn new(out: &'a mut Ranges) -> Self {
        Runs { out, run: None }
    }

    fn mark(&mut self, row: usize, series: usize, keep: bool) {
        match (keep, self.run) {
            (true, None) => self.run = Some(row),
            (false, Some(x)) => {
                self.out.push((x, row, series));
                self.run = None;
            }
            _ => {}
        }
    }

    /// Marks rows `first..first + keep.len()` as `keep` says.
    fn mark_all(&mut self, first: usize, series: usize, keep: &[bool]) {
        let mut i = 0;
        while i < keep.len() {
            // Find where the current state (in a run or not) changes.
            let inside = self.run.is_some();
            match keep[i..].iter().position(|&k| k != inside) {
                Some(j) => {
                    self.mark(first + i + j, series, !inside);
                    i += j + 1;
                }
                None => return,
            }
        }
    }

    fn end(&mut self, b: usize, series: usize) {
        if let Some(x) = self.run.take() {
            self.out.push((x, b, series));
        }
    }
}

/// The decoded page of one chunk that holds a row, for rows visited
/// mostly in ascending order (a step back searches again).
struct PageCursor<'a> {
    infos: &'a [PageInfo],
    pages: &'a [Option<Page>],
    p: usize,
}

impl<'a> PageCursor<'a> {
    fn new(infos: &'a [PageInfo], pages: &'a [Option<Page>]) -> Self {
        PageCursor { infos, pages, p: 0 }
    }

    /// The page holding group-local `row` and the row's index in it; None
    /// when the page was not decoded (or the row is past the chunk).
    fn at(&mut self, row: usize) -> Option<(&'a Page, usize)> {
        let end = |i: &PageInfo| (i.first_row + i.rows) as usize;
        if self
            .infos
            .get(self.p)
            .is_none_or(|i| i.first_row as usize > row)
        {
            self.p = self.infos.partition_point(|i| end(i) <= row);
        }
        while self.infos.get(self.p).is_some_and(|i| end(i) <= row) {
            self.p += 1;
        }
        let info = self.infos.get(self.p)?;
        let page = self.pages.get(self.p)?.as_ref()?;
        Some((page, row - info.first_row as usize))
    }
}

/// Whether a page's statistics prove `value <op> lit` false (or unknown)
/// for each of its rows. Statistics order values as the predicate does
/// (floats in total order), so the proof is exact.
fn page_excludes(info: &PageInfo, op: CompareOp, lit: &Value) -> bool {
    if info.null_count == info.rows {
        return true;
    }
    let (Some(min), Some(max)) = (&info.min, &info.max) else {
        return false;
    };
    let (Some(lo), Some(hi)) = (
        compare(&stat_value(min), lit),
        compare(&stat_value(max), lit),
    ) else {
        return false;
    };
    use std::cmp::Ordering::{Equal, Greater, Less};
    match op {
        CompareOp::CmpEq => lo == Greater || hi == Less,
        CompareOp::CmpNe => lo == Equal && hi == Equal,
        CompareOp::CmpLt => lo != Less,
        CompareOp::CmpLe => lo == Greater,
        CompareOp::CmpGt => hi != Greater,
        CompareOp::CmpGe => hi == Less,
        CompareOp::Unspecified => false,
    }
}

/// `ranges` without the rows `[x, y)`.
#[cfg(test)] // the plain model `subtract_all` is tested against
fn subtract(ranges: &Ranges, x: usize, y: usize) -> Ranges {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(a, b, s) in ranges {
        if b <= x || y <= a {
            out.push((a, b, s));
            continue;
        }
        if a < x {
            out.push((a, x, s));
        }
        if y < b {
            out.push((y, b, s));
        }
    }
    out
}

/// `ranges` (sorted by row, disjoint) without the rows of `cut` (sorted,
/// disjoint `[x, y)`), in one pass over both.
fn subtract_all(ranges: &Ranges, cut: &[(usize, usize)]) -> Ranges {
    let mut out = Vec::with_capacity(ranges.len());
    let mut k = 0;
    for &(a, b, s) in ranges {
        // Cuts that end before this range cannot touch any later one.
        while k < cut.len() && cut[k].1 <= a {
            k += 1;
        }
        let mut lo = a;
        let mut j = k;
        while lo < b {
            match cut.get(j) {
                Some(&(x, y)) if x < b => {
                    if lo < x {
                        out.push((lo, x, s));
                    }
                    lo = lo.max(y);
                    if y <= b {
                        j += 1;
                    }
                    if y >= b {
                        break;
                    }
                }
                _ => {
                    out.push((lo, b, s));
                    break;
                }
            }
        }
    }
    out
}

/// The one series key a query's tag predicates allow, when they pin every
/// tag of the table to a single value or to NULL.
fn point_key(q: &crate::scan::Query) -> Option<Vec<u8>> {
    use crate::scan::predicate::TagTest;
    let mut tags: Vec<(&str, &str)> = Vec::new();
    for c in q.table.iter().filter(|c| c.kind() == ColumnKind::Tag) {
        let pinned = q
            .tags
            .iter()
            .filter(|p| p.column == c.name)
            .find_map(|p| match &p.test {
                TagTest::In(set) if set.len() == 1 => set.iter().next().map(|v| Some(v.as_str())),
                TagTest::IsNull => Some(None),
                _ => None,
            })?;
        if let Some(v) = pinned {
            tags.push((c.name.as_str(), v));
        }
    }
    crate::rows::encode_series(&tags).ok()
}

fn no_group() -> Error {
    Error::Internal("aggregate group vanished".into())
}

fn fold_summary(
    states: &mut GroupStates,
    group: usize,
    count: u64,
    sum: Option<SumOf>,
    min: Option<&PValue>,
    max: Option<&PValue>,
) -> Result<()> {
    states
        .update_summary(group, count, sum, min, max)
        .map_err(aggregate_error)
}

#[cfg(test)]
mod tests {
    use super::{Ranges, Runs, subtract, subtract_all};
    use proptest::prelude::*;

    proptest! {
        /// Cutting many row ranges out at once leaves what cutting them one
        /// at a time leaves.
        #[test]
        fn subtracting_all_cuts_at_once_equals_one_at_a_time(
            bounds in prop::collection::btree_set(0..300usize, 0..20),
            cut_bounds in prop::collection::btree_set(0..300usize, 0..20),
        ) {
            let bounds: Vec<usize> = bounds.into_iter().collect();
            // Disjoint sorted ranges, series numbered in order, some gaps.
            let ranges: Ranges = bounds
                .chunks_exact(2)
                .enumerate()
                .map(|(s, w)| (w[0], w[1], s))
                .collect();
            let cut_bounds: Vec<usize> = cut_bounds.into_iter().collect();
            let cuts: Vec<(usize, usize)> =
                cut_bounds.chunks_exact(2).map(|w| (w[0], w[1])).collect();
            let mut one = ranges.clone();
            for &(x, y) in &cuts {
                one = subtract(&one, x, y);
            }
            prop_assert_eq!(subtract_all(&ranges, &cuts), one);
        }

        /// Marking a segment's rows at once gives the runs that marking
        /// them one by one gives, wherever the segments split the rows.
        #[test]
        fn marking_a_segment_equals_marking_each_row(
            keep in prop::collection::vec(any::<bool>(), 0..200),
            cuts in prop::collection::vec(0..200usize, 0..6),
            first in 0..50usize,
        ) {
            let mut one: Ranges = Vec::new();
            let mut runs = Runs::new(&mut one);
            for (i, &k) in keep.iter().enumerate() {
                runs.mark(first + i, 7, k);
            }
            runs.end(first + keep.len(), 7);

            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(keep.len())).collect();
            cuts.push(0);
            cuts.push(keep.len());
            cuts.sort_unstable();
            let mut all: Ranges = Vec::new();
            let mut runs = Runs::new(&mut all);
            for w in cuts.windows(2) {
                runs.mark_all(first + w[0], 7, &keep[w[0]..w[1]]);
            }
            runs.end(first + keep.len(), 7);
            prop_assert_eq!(all, one);
        }
    }
}
