// What a PromQL expression reads, for tests that check an expression's
// series exist before they judge its (possibly empty) answer.
#ifndef SYNCNORM_TESTS_TESTING_PROMQL_H_
#define SYNCNORM_TESTS_TESTING_PROMQL_H_

#include <set>
#include <string>

#include "absl/strings/string_view.h"

namespace syncnorm::testing {

// The metric names `expr` selects, sorted: every identifier that is not a
// function or aggregation (followed by "("), a keyword (by, on, bool,
// offset, ...), a label named in a grouping list, a number (1e6, Inf,
// NaN) or a duration, and that does not lie inside a label matcher
// ({...}), a range ([...]) or a string. A selector given only by its
// labels ({__name__="x"}) names nothing here. Does not check the syntax:
// Prometheus does that.
std::set<std::string> MetricNames(absl::string_view expr);

}  // namespace syncnorm::testing

#endif  // SYNCNORM_TESTS_TESTING_PROMQL_H_
