// ivcuda-smi: the guest's nvidia-smi. The GPUs this guest was given, as the
// guest's NVML (libnvidia-ml.so.1, guest/nvml) reports them: a table with a
// processes section, `-L`, and `--query-gpu=FIELDS --format=csv[,noheader][,nounits]`
// for scripts. Memory is the tenant's view (its quota and what it holds);
// utilization, temperature and power are the GPU's.
//
// Works against any libnvidia-ml.so.1, NVIDIA's included: it uses NVML's
// public API only.
#include <nvml.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr unsigned long long kMiB = 1024ULL * 1024ULL;
const std::string kNA = "[N/A]";
const std::string kNotSupported = "[Not Supported]";

// A value, or what nvidia-smi prints in its place.
std::string failed(nvmlReturn_t r) { return r == NVML_ERROR_NOT_SUPPORTED ? kNotSupported : kNA; }

struct Gpu {
  unsigned index = 0;
  nvmlDevice_t dev = nullptr;
};

std::string text_of(nvmlReturn_t (*fn)(nvmlDevice_t, char*, unsigned), nvmlDevice_t d) {
  char buf[256] = {};
  const nvmlReturn_t r = fn(d, buf, sizeof buf);
  return r == NVML_SUCCESS ? std::string(buf) : failed(r);
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// One --query-gpu field: its value (units when `units`), or [N/A] / [Not Supported].
using Field = std::function<std::string(const Gpu&, bool units)>;

std::string mem_field(const Gpu& g, bool units, int which) {
  nvmlMemory_t m{};
  const nvmlReturn_t r = nvmlDeviceGetMemoryInfo(g.dev, &m);
  if (r != NVML_SUCCESS) return failed(r);
  const unsigned long long v = which == 0 ? m.total : which == 1 ? m.used : m.free;
  return std::to_string(v / kMiB) + (units ? " MiB" : "");
}

std::string power_field(const Gpu& g, bool units, bool limit) {
  unsigned mw = 0;
  const nvmlReturn_t r = limit ? nvmlDeviceGetPowerManagementLimit(g.dev, &mw) : nvmlDeviceGetPowerUsage(g.dev, &mw);
  if (r != NVML_SUCCESS) return failed(r);
  return fixed(mw / 1000.0, 2) + (units ? " W" : "");
}

const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> f = {
      {"index", [](const Gpu& g, bool) { return std::to_string(g.index); }},
      {"name", [](const Gpu& g, bool) { return text_of(nvmlDeviceGetName, g.dev); }},
      {"uuid", [](const Gpu& g, bool) { return text_of(nvmlDeviceGetUUID, g.dev); }},
      {"serial", [](const Gpu& g, bool) { return text_of(nvmlDeviceGetSerial, g.dev); }},
      {"pci.bus_id",
       [](const Gpu& g, bool) {
         nvmlPciInfo_t p{};
         const nvmlReturn_t r = nvmlDeviceGetPciInfo_v3(g.dev, &p);
         return r == NVML_SUCCESS ? std::string(p.busId) : failed(r);
       }},
      {"memory.total", [](const Gpu& g, bool u) { return mem_field(g, u, 0); }},
      {"memory.used", [](const Gpu& g, bool u) { return mem_field(g, u, 1); }},
      {"memory.free", [](const Gpu& g, bool u) { return mem_field(g, u, 2); }},
      {"utilization.gpu",
       [](const Gpu& g, bool u) {
         nvmlUtilization_t x{};
         const nvmlReturn_t r = nvmlDeviceGetUtilizationRates(g.dev, &x);
         return r == NVML_SUCCESS ? std::to_string(x.gpu) + (u ? " %" : "") : failed(r);
       }},
      {"utilization.memory",
       [](const Gpu& g, bool u) {
         nvmlUtilization_t x{};
         const nvmlReturn_t r = nvmlDeviceGetUtilizationRates(g.dev, &x);
         return r == NVML_SUCCESS ? std::to_string(x.memory) + (u ? " %" : "") : failed(r);
       }},
      {"temperature.gpu",
       [](const Gpu& g, bool) {
         unsigned t = 0;
         const nvmlReturn_t r = nvmlDeviceGetTemperature(g.dev, NVML_TEMPERATURE_GPU, &t);
         return r == NVML_SUCCESS ? std::to_string(t) : failed(r);  // nvidia-smi prints no unit here
       }},
      {"power.draw", [](const Gpu& g, bool u) { return power_field(g, u, false); }},
      {"power.limit", [](const Gpu& g, bool u) { return power_field(g, u, true); }},
      {"pstate",
       [](const Gpu& g, bool) {
         nvmlPstates_t p{};
         const nvmlReturn_t r = nvmlDeviceGetPerformanceState(g.dev, &p);
         return r == NVML_SUCCESS ? "P" + std::to_string(static_cast<int>(p)) : failed(r);
       }},
      {"driver_version",
       [](const Gpu&, bool) {
         char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
         const nvmlReturn_t r = nvmlSystemGetDriverVersion(buf, sizeof buf);
         return r == NVML_SUCCESS ? std::string(buf) : failed(r);
       }},
      {"count",
       [](const Gpu&, bool) {
         unsigned n = 0;
         const nvmlReturn_t r = nvmlDeviceGetCount_v2(&n);
         return r == NVML_SUCCESS ? std::to_string(n) : failed(r);
       }},
  };
  return f;
}

// What nvidia-smi's CSV header says for a field (with units unless nounits).
std::string header_of(const std::string& f, bool units) {
  static const std::map<std::string, std::string> unit = {
      {"memory.total", "MiB"}, {"memory.used", "MiB"}, {"memory.free", "MiB"}, {"utilization.gpu", "%"},
      {"utilization.memory", "%"}, {"power.draw", "W"}, {"power.limit", "W"}};
  const auto it = unit.find(f);
  return units && it != unit.end() ? f + " [" + it->second + "]" : f;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

int query_gpu(const std::vector<Gpu>& gpus, const std::string& query, const std::string& format) {
  bool header = true, units = true;
  const auto fmt = split(format, ',');
  if (fmt.empty() || fmt[0] != "csv") {
    std::cerr << "ivcuda-smi: --format must start with csv (csv[,noheader][,nounits])\n";
    return 2;
  }
  for (std::size_t i = 1; i < fmt.size(); ++i) {
    if (fmt[i] == "noheader") {
      header = false;
    } else if (fmt[i] == "nounits") {
      units = false;
    } else {
      std::cerr << "ivcuda-smi: unknown --format option \"" << fmt[i] << "\"\n";
      return 2;
    }
  }
  std::vector<std::string> names;
  for (std::string f : split(query, ',')) {
    f.erase(0, f.find_first_not_of(' '));
    if (fields().count(f) == 0) {
      std::cerr << "Field \"" << f << "\" is not a valid field to query.\n";
      return 2;
    }
    names.push_back(f);
  }
  if (names.empty()) {
    std::cerr << "ivcuda-smi: --query-gpu needs at least one field\n";
    return 2;
  }
  if (header) {
    for (std::size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << header_of(names[i], units);
    std::cout << "\n";
  }
  for (const Gpu& g : gpus) {
    for (std::size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : "") << fields().at(names[i])(g, units);
    std::cout << "\n";
  }
  return 0;
}

int list(const std::vector<Gpu>& gpus) {
  for (const Gpu& g : gpus)
    std::cout << "GPU " << g.index << ": " << text_of(nvmlDeviceGetName, g.dev)
              << " (UUID: " << text_of(nvmlDeviceGetUUID, g.dev) << ")\n";
  return 0;
}

// The guest's pids are this system's: their names come from /proc here.
std::string process_name(unsigned pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmd;
  std::getline(in, cmd, '\0');
  return cmd.empty() ? kNA : cmd;
}

std::string cell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s.substr(0, width) : s + std::string(width - s.size(), ' ');
}
std::string rcell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s.substr(0, width) : std::string(width - s.size(), ' ') + s;
}

int table(const std::vector<Gpu>& gpus) {
  const std::string rule = "+" + std::string(89, '-') + "+";
  const std::string thin = "|" + std::string(89, '=') + "|";
  char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  const std::string drv = nvmlSystemGetDriverVersion(driver, sizeof driver) == NVML_SUCCESS ? driver : kNA;
  int cuda = 0;
  const std::string cu = nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS
                             ? std::to_string(cuda / 1000) + "." + std::to_string(cuda % 1000 / 10)
                             : kNA;
  std::cout << rule << "\n"
            << "| " << cell("ivcuda-smi", 28) << cell("Driver Version: " + drv, 32) << cell("CUDA Version: " + cu, 28)
            << "|\n"
            << rule << "\n"
            << "| " << cell("GPU  Name", 30) << cell("Bus-Id", 19) << cell("Memory-Usage", 22) << cell("GPU-Util", 17)
            << "|\n"
            << "| " << cell("     Temp  Perf  Pwr:Usage/Cap", 30) << std::string(58, ' ') << "|\n"
            << thin << "\n";
  for (const Gpu& g : gpus) {
    const bool u = true;
    const auto& f = fields();
    const std::string mem = f.at("memory.used")(g, u) + " / " + f.at("memory.total")(g, u);
    const std::string temp = f.at("temperature.gpu")(g, u);
    const std::string pwr = f.at("power.draw")(g, u) + " / " + f.at("power.limit")(g, u);
    std::cout << "| " << cell(std::to_string(g.index) + "    " + f.at("name")(g, u), 30)
              << cell(f.at("pci.bus_id")(g, u), 19) << cell(mem, 22) << cell(f.at("utilization.gpu")(g, u), 17)
              << "|\n"
              << "| " << cell("     " + (temp == kNA || temp == kNotSupported ? temp : temp + "C") + "  " +
                                  f.at("pstate")(g, u) + "  " + pwr,
                              88)
              << "|\n"
              << rule << "\n";
  }
  std::cout << "\n"
            << rule << "\n"
            << "| " << cell("Processes:", 88) << "|\n"
            << "| " << cell("GPU", 6) << rcell("PID", 10) << "  " << cell("Process name", 54) << rcell("GPU Memory", 16)
            << "|\n"
            << thin << "\n";
  bool any = false;
  for (const Gpu& g : gpus) {
    unsigned n = 0;
    nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(g.dev, &n, nullptr);
    std::vector<nvmlProcessInfo_t> procs;
    while (r == NVML_ERROR_INSUFFICIENT_SIZE) {  // the list may grow between the two calls
      procs.resize(n + 4);
      n = static_cast<unsigned>(procs.size());
      r = nvmlDeviceGetComputeRunningProcesses_v3(g.dev, &n, procs.data());
    }
    if (r != NVML_SUCCESS) {
      std::cout << "| " << cell(std::to_string(g.index), 6) << cell("processes: " + failed(r), 82) << "|\n";
      continue;
    }
    procs.resize(n);
    for (const nvmlProcessInfo_t& p : procs) {
      any = true;
      const std::string mem = p.usedGpuMemory == static_cast<unsigned long long>(NVML_VALUE_NOT_AVAILABLE)
                                  ? kNA
                                  : std::to_string(p.usedGpuMemory / kMiB) + "MiB";
      std::cout << "| " << cell(std::to_string(g.index), 6) << rcell(std::to_string(p.pid), 10) << "  "
                << cell(process_name(p.pid), 54) << rcell(mem, 16) << "|\n";
    }
  }
  if (!any) std::cout << "| " << cell("No running processes found", 88) << "|\n";
  std::cout << rule << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ivcuda-smi: the GPUs this guest was given, through ivcuda's NVML"};
  bool list_gpus = false;
  std::string query, format = "csv";
  app.add_flag("-L,--list-gpus", list_gpus, "list the GPUs: GPU i: NAME (UUID: ...)");
  app.add_option("--query-gpu", query, "comma-separated fields: index,name,uuid,serial,pci.bus_id,memory.total,"
                                       "memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,"
                                       "power.draw,power.limit,pstate,driver_version,count");
  app.add_option("--format", format, "csv[,noheader][,nounits] (with --query-gpu)");
  CLI11_PARSE(app, argc, argv);

  const nvmlReturn_t r = nvmlInit_v2();
  if (r != NVML_SUCCESS) {
    std::cerr << "ivcuda-smi: NVML could not start: " << nvmlErrorString(r) << "\n";
    return r == NVML_ERROR_DRIVER_NOT_LOADED || r == NVML_ERROR_LIBRARY_NOT_FOUND ? 9 : 1;
  }
  std::vector<Gpu> gpus;
  unsigned count = 0;
  if (const nvmlReturn_t c = nvmlDeviceGetCount_v2(&count); c != NVML_SUCCESS) {
    std::cerr << "ivcuda-smi: device count: " << nvmlErrorString(c) << "\n";
    nvmlShutdown();
    return 1;
  }
  for (unsigned i = 0; i < count; ++i) {
    Gpu g;
    g.index = i;
    if (const nvmlReturn_t h = nvmlDeviceGetHandleByIndex_v2(i, &g.dev); h != NVML_SUCCESS) {
      std::cerr << "ivcuda-smi: GPU " << i << ": " << nvmlErrorString(h) << "\n";
      nvmlShutdown();
      return 1;
    }
    gpus.push_back(g);
  }
  int rc;
  if (list_gpus) {
    rc = list(gpus);
  } else if (!query.empty()) {
    rc = query_gpu(gpus, query, format);
  } else {
    rc = table(gpus);
  }
  nvmlShutdown();
  return rc;
}
