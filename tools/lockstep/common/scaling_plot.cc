// The scaling plot; see scaling_plot.h.
#include "common/scaling_plot.h"

#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

namespace lockstep::cli {

std::string plot_scaling(const std::vector<PlotRow>& rows, const std::filesystem::path& dir, const std::string& title,
                         const std::string& rest_title) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) return "";
  const auto data = dir / "scaling.dat", script = dir / "scaling.gp", png = dir / "scaling.png";
  {
    std::ofstream out(data);
    for (const auto& r : rows)
      out << fmt::format("{} {:.3f} {:.3f} {:.3f} {:.3f} {:.3f}\n", r.ranks, r.compute_ms, r.exposed_ms, r.data_ms,
                         r.rest_ms, r.efficiency);
  }
  std::ofstream(script) << fmt::format(
      "set terminal pngcairo size 900,520\nset output '{}'\nset title '{}'\n"
      "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\n"
      "set boxwidth 0.6\nset xlabel 'ranks'\nset ylabel 'step time (ms)'\nset y2label 'efficiency'\n"
      "set y2range [0:1.1]\nset ytics nomirror\nset y2tics\nset key outside right\n"
      "plot '{}' using 2:xtic(1) title 'compute' lc rgb '#4477aa', '' using 3 title 'exposed communication' lc rgb "
      "'#ee6677', '' using 4 title 'data loading' lc rgb '#ccbb44', '' using 5 title '{}' lc rgb "
      "'#bbbbbb', '' using 0:6 axes x1y2 with linespoints lw 2 pt 7 lc rgb '#228833' title 'efficiency'\n",
      png.string(), title, data.string(), rest_title);
  const int rc = std::system(fmt::format("gnuplot '{}' > '{}' 2>&1", script.string(), (dir / "gnuplot.log").string()).c_str());
  return rc == 0 && std::filesystem::exists(png) ? png.string() : "";
}

}  // namespace lockstep::cli
