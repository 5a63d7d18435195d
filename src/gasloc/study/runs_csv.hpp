// Runs' metric lines as one tidy CSV (`gasloc report --csv`), and CSV cells written and read.
#pragma once
#include <string>
#include <vector>

namespace gasloc::study {

// Every train and eval line of the runs as one tidy CSV: columns run, event, worker, step, then
// the metrics (kCsvColumns). A train line is one row (event "train", its worker). An eval line is
// one row for the average model (event "eval", worker empty) and one per worker's own model
// (event "eval_worker", with that worker's val_loss). Missing values are empty cells.
std::string runs_csv(const std::vector<std::string>& dirs, const std::vector<std::string>& labels);
extern const std::vector<std::string> kCsvColumns;

// A CSV cell: quoted (with "" for ") when it holds a comma, a quote or a line break.
std::string csv_cell(const std::string& s);
// The rows of a CSV text (RFC 4180: quoted cells may hold commas, "" and line breaks); a final
// line break ends the last row. Throws DataError naming `where` for an unclosed quote.
std::vector<std::vector<std::string>> parse_csv(const std::string& text, const std::string& where);

}  // namespace gasloc::study
