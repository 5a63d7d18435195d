// uPlot (https://github.com/leeoniya/uPlot, MIT licence), the chart library of the dashboard
// page, embedded into the program at build time from third_party/uplot (scripts/setup.sh fetches
// it with `npm pack`; cmake/embed_uplot.cmake writes the source that defines these). Nothing is
// fetched at run time. A build without it defines them empty.
#pragma once
#include <string_view>

namespace gasloc::study {

std::string_view uplot_js();       // dist/uPlot.iife.min.js: defines the global uPlot
std::string_view uplot_css();      // dist/uPlot.min.css
std::string_view uplot_version();  // package.json's version; empty without uPlot
std::string_view uplot_license();  // its LICENSE, shown in the page's source

}  // namespace gasloc::study
