//! Name patterns: `*` stands for any run of characters, `?` for one, as the table
//! filter (`source.include`/`exclude`), the database list (`source.databases`) and
//! the column rules write them.

/// `*`/`?` matching, iterative with backtracking to the last star.
pub fn glob_match(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(c) if *c == '?' || *c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// Whether `name` matches `pattern` (`*`, `?`), ignoring case as SQL Server's
/// default collations compare names.
pub fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.to_lowercase().chars().collect();
    let name: Vec<char> = name.to_lowercase().chars().collect();
    glob_match(&pattern, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(pattern: &str, text: &str) -> bool {
        let pattern: Vec<char> = pattern.chars().collect();
        let text: Vec<char> = text.chars().collect();
        glob_match(&pattern, &text)
    }

    #[test]
    fn stars_take_any_run_and_question_marks_one_character() {
        assert!(glob("dbo.*", "dbo.orders"));
        assert!(glob("dbo.*", "dbo."));
        assert!(!glob("dbo.*", "sales.orders"));
        assert!(glob("*.order?", "sales.orders"));
        assert!(!glob("*.order?", "sales.order"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        // Backtracking: the first `b` is not the one the pattern needs.
        assert!(glob("*bc", "abbc"));
        assert!(glob("**", ""));
        assert!(!glob("?", ""));
        assert!(glob("", ""));
        assert!(!glob("", "a"));
    }

    #[test]
    fn names_match_without_case_as_sql_server_compares_them() {
        assert!(matches("Shop*", "shop1"));
        assert!(matches("shop?", "SHOP2"));
        assert!(!matches("Shop?", "Shop10"));
    }
}
