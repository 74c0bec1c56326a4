// The dashboard's static files, embedded in the binary at build time: the page's own
// HTML, script and style sheet (src/server/dashboard/), and uPlot's script, style sheet
// and licence, installed from the npm registry at the version that
// src/server/dashboard/package-lock.json pins. cmake/EmbedFiles.cmake writes the
// definition (dashboard_assets.cc in the build folder); nothing is fetched at run time.
// Built with -DSHOAL_DASHBOARD=OFF, the list is empty.
#pragma once

#include <span>
#include <string_view>

namespace shoal::server {

struct DashboardAsset {
  std::string_view name;  // the path below /dashboard/, e.g. "uplot.min.js"
  std::string_view bytes;
};

std::span<const DashboardAsset> DashboardAssets();

}  // namespace shoal::server
