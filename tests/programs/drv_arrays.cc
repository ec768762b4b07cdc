// CUDA arrays, mipmapped arrays, copies with them, texture and surface objects,
// through the driver API: 1D/2D/3D arrays of several formats, descriptor
// queries, HtoA/AtoH/AtoA/DtoA/AtoD and their async forms, 2D and 3D copies
// with offsets (pageable, page-locked and device memory, big enough to need
// several staging bands through ivcuda), a kernel sampling a texture object
// over an array and over pitched memory, a kernel writing a surface, and
// invalid uses. Every result is checked against a CPU model. Where the
// driver's exact error is not documented the program prints it (the GPU suite
// compares the native and the ivcuda output) and only checks it is an error.
//   drv_arrays --ptx test_kernels.ptx [--destroyed-handles]
// --destroyed-handles adds uses of a destroyed array (ivcuda refuses them;
// the real driver may follow the dangling handle).
#include <algorithm>
#include <cmath>

#include "check.h"

namespace {

// Prints an answer whose exact value the GPU run decides; it must be an error.
void uncertain(const char* what, CUresult r) {
  std::printf("arrays: %s -> %s\n", what, check::name(r));
  ++check::g_checks;
  if (r == CUDA_SUCCESS) check::fail(__FILE__, __LINE__, std::string(what) + " succeeded");
}

CUarray make_array(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned flags) {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = w;
  desc.Height = h;
  desc.Depth = d;
  desc.Format = f;
  desc.NumChannels = ch;
  desc.Flags = flags;
  CUarray a = nullptr;
  OK(cuArray3DCreate(&a, &desc));
  return a;
}

void print_desc(const char* name, CUarray a) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  OK(cuArray3DGetDescriptor(&d, a));
  std::printf("arrays: %s: %zux%zux%zu format 0x%x channels %u flags 0x%x\n", name, d.Width, d.Height, d.Depth,
              static_cast<unsigned>(d.Format), d.NumChannels, d.Flags);
}

CUDA_MEMCPY3D copy3d() {
  CUDA_MEMCPY3D c{};
  return c;
}

// 1D arrays and the byte-offset copies.
void one_d(CUstream s) {
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 1024;
  d.Height = 0;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr, b = nullptr;
  OK(cuArrayCreate(&a, &d));
  d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d.NumChannels = 4;
  OK(cuArrayCreate(&b, &d));
  CUDA_ARRAY_DESCRIPTOR q{};
  OK(cuArrayGetDescriptor(&q, a));
  EXPECT(q.Width == 1024 && q.Height == 0 && q.Format == CU_AD_FORMAT_FLOAT && q.NumChannels == 1);
  print_desc("1D float", a);
  print_desc("1D uchar4", b);

  const size_t bytes = 4096;
  const auto data = check::random_bytes(bytes, 11);
  std::vector<unsigned char> back(bytes), model(bytes, 0);
  OK(cuMemcpyHtoA(a, 0, data.data(), bytes));
  OK(cuMemcpyAtoH(back.data(), a, 0, bytes));
  EXPECT(back == data);
  // Offsets on both sides, array to array.
  OK(cuMemcpyAtoA(b, 100, a, 40, 2000));
  std::vector<unsigned char> zero(bytes, 0);
  OK(cuMemcpyHtoA(b, 0, zero.data(), 100));
  OK(cuMemcpyAtoH(back.data(), b, 0, 2100));
  EXPECT(std::equal(back.begin() + 100, back.begin() + 2100, data.begin() + 40));
  // Device memory both ways.
  CUdeviceptr dp = 0;
  OK(cuMemAlloc(&dp, bytes));
  OK(cuMemcpyHtoD(dp, data.data(), bytes));
  OK(cuMemcpyDtoA(b, 0, dp + 8, 1024));
  CUdeviceptr dq = 0;
  OK(cuMemAlloc(&dq, bytes));
  OK(cuMemsetD8(dq, 0, bytes));
  OK(cuMemcpyAtoD(dq + 4, b, 0, 1024));
  OK(cuMemcpyDtoH(back.data(), dq, bytes));
  EXPECT(std::equal(back.begin() + 4, back.begin() + 1028, data.begin() + 8));
  EXPECT(back[0] == 0 && back[1028] == 0);
  // Async, page-locked and pageable.
  unsigned char* pinned = nullptr;
  OK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), bytes));
  std::fill(pinned, pinned + bytes, 0);
  const auto data2 = check::random_bytes(bytes, 12);
  OK(cuMemcpyHtoAAsync(a, 0, data2.data(), bytes, s));
  OK(cuMemcpyAtoHAsync(pinned, a, 0, bytes, s));
  OK(cuStreamSynchronize(s));
  EXPECT(std::equal(pinned, pinned + bytes, data2.begin()));
  std::copy(data.begin(), data.end(), pinned);
  OK(cuMemcpyHtoAAsync(b, 0, pinned, bytes, s));
  std::vector<unsigned char> back2(bytes);
  OK(cuMemcpyAtoHAsync(back2.data(), b, 0, bytes, s));
  OK(cuStreamSynchronize(s));
  EXPECT(back2 == data);

  // Out of range: past the end, an offset past the end.
  uncertain("HtoA past the end", cuMemcpyHtoA(a, 4000, data.data(), 200));
  uncertain("AtoH offset past the end", cuMemcpyAtoH(back.data(), a, 8192, 4));
  uncertain("AtoA past the source's end", cuMemcpyAtoA(b, 0, a, 3000, 2000));
  OK(cuMemFreeHost(pinned));
  OK(cuMemFree(dp));
  OK(cuMemFree(dq));
  OK(cuArrayDestroy(a));
  OK(cuArrayDestroy(b));
}

// 2D arrays: copies with offsets from pageable, page-locked and device memory.
void two_d(CUstream s) {
  const size_t W = 64, H = 32, elem = 4;  // uchar4
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = W;
  d.Height = H;
  d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d.NumChannels = 4;
  CUarray a = nullptr;
  OK(cuArrayCreate(&a, &d));
  print_desc("2D uchar4", a);
  CUarray s16 = make_array(30, 10, 0, CU_AD_FORMAT_SIGNED_INT16, 2, 0);
  print_desc("2D short2", s16);
  CUarray hf = make_array(17, 5, 0, CU_AD_FORMAT_HALF, 1, 0);
  print_desc("2D half", hf);

  std::vector<unsigned char> model(W * elem * H, 0);
  std::vector<unsigned char> zero(model.size(), 0);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = zero.data();
  c.srcPitch = W * elem;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = W * elem;
  c.Height = H;
  OK(cuMemcpy2D(&c));
  // A 20x10-element block from (3, 2) of a pitched host image into (7, 5) of the array.
  const size_t img_pitch = 100 * elem;
  const auto img = check::random_bytes(img_pitch * 40, 21);
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = img.data();
  c.srcPitch = img_pitch;
  c.srcXInBytes = 3 * elem;
  c.srcY = 2;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstXInBytes = 7 * elem;
  c.dstY = 5;
  c.WidthInBytes = 20 * elem;
  c.Height = 10;
  OK(cuMemcpy2D(&c));
  for (size_t y = 0; y < 10; ++y)
    std::copy_n(img.begin() + (2 + y) * img_pitch + 3 * elem, 20 * elem, model.begin() + (5 + y) * W * elem + 7 * elem);
  // Device pitched memory into another block, asynchronously.
  CUdeviceptr dp = 0;
  size_t dpitch = 0;
  OK(cuMemAllocPitch(&dp, &dpitch, W * elem, H, 4));
  const auto dev_img = check::random_bytes(dpitch * H, 22);
  OK(cuMemcpyHtoD(dp, dev_img.data(), dev_img.size()));
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = dp;
  c.srcPitch = dpitch;
  c.srcY = 1;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstXInBytes = 40 * elem;
  c.dstY = 20;
  c.WidthInBytes = 24 * elem;
  c.Height = 12;
  OK(cuMemcpy2DAsync(&c, s));
  OK(cuStreamSynchronize(s));
  for (size_t y = 0; y < 12; ++y)
    std::copy_n(dev_img.begin() + (1 + y) * dpitch, 24 * elem, model.begin() + (20 + y) * W * elem + 40 * elem);
  // The whole array back, into page-locked memory through unified addressing.
  unsigned char* pinned = nullptr;
  OK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), model.size()));
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = reinterpret_cast<CUdeviceptr>(pinned);
  c.dstPitch = W * elem;
  c.WidthInBytes = W * elem;
  c.Height = H;
  OK(cuMemcpy2D(&c));
  EXPECT(std::equal(model.begin(), model.end(), pinned));
  // A block of the array into device memory, then checked through the host.
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.srcXInBytes = 6 * elem;
  c.srcY = 4;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dp;
  c.dstPitch = dpitch;
  c.WidthInBytes = 30 * elem;
  c.Height = 20;
  OK(cuMemcpy2D(&c));
  std::vector<unsigned char> back(dpitch * H);
  OK(cuMemcpyDtoH(back.data(), dp, back.size()));
  bool same = true;
  for (size_t y = 0; y < 20; ++y)
    same = same && std::equal(back.begin() + y * dpitch, back.begin() + y * dpitch + 30 * elem,
                              model.begin() + (4 + y) * W * elem + 6 * elem);
  EXPECT(same);
  // Array to array (2D).
  CUarray a2 = make_array(W, H, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0);
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a2;
  c.WidthInBytes = W * elem;
  c.Height = H;
  OK(cuMemcpy2D(&c));
  std::vector<unsigned char> back2(model.size());
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a2;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = back2.data();
  c.dstPitch = W * elem;
  c.WidthInBytes = W * elem;
  c.Height = H;
  OK(cuMemcpy2D(&c));
  EXPECT(back2 == model);

  // Out of range: rows past the bottom, bytes past the right edge.
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = img.data();
  c.srcPitch = img_pitch;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstY = 30;
  c.WidthInBytes = 8 * elem;
  c.Height = 3;
  uncertain("2D copy past the array's last row", cuMemcpy2D(&c));
  c.dstY = 0;
  c.dstXInBytes = 60 * elem;
  uncertain("2D copy past the array's right edge", cuMemcpy2D(&c));
  // (Reading past the allocation: should the driver not check, nothing is
  // overwritten.)
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = dp;
  c.srcPitch = dpitch;
  c.srcY = 1;  // one row more than the allocation holds
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = W * elem;
  c.Height = H;
  uncertain("2D copy into an array from past a device allocation's end", cuMemcpy2D(&c));

  OK(cuMemFreeHost(pinned));
  OK(cuMemFree(dp));
  OK(cuArrayDestroy(a));
  OK(cuArrayDestroy(a2));
  OK(cuArrayDestroy(s16));
  OK(cuArrayDestroy(hf));
}

// 3D arrays: cuMemcpy3D with offsets in all three dimensions, and copies big
// enough to need several staging bands (by slices, and by rows of one slice).
void three_d(CUstream s) {
  const size_t W = 16, H = 8, D = 6, elem = 4;  // ushort2
  CUarray a = make_array(W, H, D, CU_AD_FORMAT_UNSIGNED_INT16, 2, 0);
  print_desc("3D ushort2", a);
  CUarray layered = make_array(32, 4, 3, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED);
  print_desc("2D layered float", layered);
  CUDA_ARRAY_DESCRIPTOR d2{};
  std::printf("arrays: cuArrayGetDescriptor of a 3D array -> %s\n", check::name(cuArrayGetDescriptor(&d2, a)));

  const auto src = check::random_bytes(W * elem * H * D, 31);
  std::vector<unsigned char> model = src;
  CUDA_MEMCPY3D c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src.data();
  c.srcPitch = W * elem;
  c.srcHeight = H;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = W * elem;
  c.Height = H;
  c.Depth = D;
  OK(cuMemcpy3D(&c));
  // A sub-box from device memory (pitch 80 bytes, 10 rows per slice) into (2, 1, 1).
  const size_t dpitch = 80, dheight = 10, ddepth = 5;
  const auto dev_box = check::random_bytes(dpitch * dheight * ddepth, 32);
  CUdeviceptr dp = 0;
  OK(cuMemAlloc(&dp, dev_box.size()));
  OK(cuMemcpyHtoD(dp, dev_box.data(), dev_box.size()));
  c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = dp;
  c.srcPitch = dpitch;
  c.srcHeight = dheight;
  c.srcXInBytes = 8;
  c.srcY = 3;
  c.srcZ = 1;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstXInBytes = 2 * elem;
  c.dstY = 1;
  c.dstZ = 1;
  c.WidthInBytes = 10 * elem;
  c.Height = 6;
  c.Depth = 4;
  OK(cuMemcpy3DAsync(&c, s));
  OK(cuStreamSynchronize(s));
  for (size_t z = 0; z < 4; ++z)
    for (size_t y = 0; y < 6; ++y)
      std::copy_n(dev_box.begin() + (1 + z) * dpitch * dheight + (3 + y) * dpitch + 8, 10 * elem,
                  model.begin() + ((1 + z) * H + 1 + y) * W * elem + 2 * elem);
  // A sub-box back into page-locked memory with its own offsets.
  const size_t hp = 96, hh = 9;
  unsigned char* pinned = nullptr;
  OK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), hp * hh * 5));
  std::fill(pinned, pinned + hp * hh * 5, 0xee);
  c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.srcXInBytes = 1 * elem;
  c.srcY = 2;
  c.srcZ = 2;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = pinned;
  c.dstPitch = hp;
  c.dstHeight = hh;
  c.dstXInBytes = 4;
  c.dstY = 1;
  c.dstZ = 1;
  c.WidthInBytes = 12 * elem;
  c.Height = 5;
  c.Depth = 3;
  OK(cuMemcpy3D(&c));
  bool same = true;
  for (size_t z = 0; z < 3; ++z)
    for (size_t y = 0; y < 5; ++y)
      same = same && std::equal(model.begin() + ((2 + z) * H + 2 + y) * W * elem + elem,
                                model.begin() + ((2 + z) * H + 2 + y) * W * elem + elem + 12 * elem,
                                pinned + (1 + z) * hp * hh + (1 + y) * hp + 4);
  EXPECT(same);
  EXPECT(pinned[0] == 0xee && pinned[hp * hh + hp + 3] == 0xee);
  // The whole array back through pageable memory.
  std::vector<unsigned char> back(model.size());
  c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = back.data();
  c.dstPitch = W * elem;
  c.dstHeight = H;
  c.WidthInBytes = W * elem;
  c.Height = H;
  c.Depth = D;
  OK(cuMemcpy3D(&c));
  EXPECT(back == model);

  // Big: 512x256x24 uchar4 (12 MiB) in and out of pageable memory, and a
  // 4096x768 float 2D array (12 MiB in one slice).
  {
    CUarray big = make_array(512, 256, 24, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0);
    const auto in = check::random_bytes(512 * 4 * 256 * 24, 33);
    std::vector<unsigned char> out(in.size());
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = in.data();
    c.srcPitch = 2048;
    c.srcHeight = 256;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = big;
    c.WidthInBytes = 2048;
    c.Height = 256;
    c.Depth = 24;
    OK(cuMemcpy3D(&c));
    std::swap(c.srcMemoryType, c.dstMemoryType);
    c.srcArray = big;
    c.dstArray = nullptr;
    c.srcHost = nullptr;
    c.dstHost = out.data();
    c.dstPitch = 2048;
    c.dstHeight = 256;
    c.srcPitch = 0;
    c.srcHeight = 0;
    OK(cuMemcpy3DAsync(&c, s));
    OK(cuStreamSynchronize(s));
    EXPECT(out == in);
    OK(cuArrayDestroy(big));
    CUarray wide = make_array(4096, 768, 0, CU_AD_FORMAT_FLOAT, 1, 0);
    const auto in2 = check::random_bytes(4096 * 4 * 768, 34);
    std::vector<unsigned char> out2(in2.size());
    CUDA_MEMCPY2D c2{};
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = in2.data();
    c2.srcPitch = 4096 * 4;
    c2.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c2.dstArray = wide;
    c2.WidthInBytes = 4096 * 4;
    c2.Height = 768;
    OK(cuMemcpy2D(&c2));
    c2 = CUDA_MEMCPY2D{};
    c2.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c2.srcArray = wide;
    c2.dstMemoryType = CU_MEMORYTYPE_HOST;
    c2.dstHost = out2.data();
    c2.dstPitch = 4096 * 4;
    c2.WidthInBytes = 4096 * 4;
    c2.Height = 768;
    OK(cuMemcpy2D(&c2));
    EXPECT(out2 == in2);
    OK(cuArrayDestroy(wide));
  }

  // Out of range: a slice past the last, a device box past its allocation.
  c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src.data();
  c.srcPitch = W * elem;
  c.srcHeight = H;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstZ = 4;
  c.WidthInBytes = W * elem;
  c.Height = H;
  c.Depth = 3;
  uncertain("3D copy past the array's last slice", cuMemcpy3D(&c));
  c = copy3d();
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = dp;
  c.srcPitch = dpitch;
  c.srcHeight = dheight;
  c.srcZ = 2;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = W * elem;
  c.Height = H;
  c.Depth = 4;
  uncertain("3D copy from past a device allocation's end", cuMemcpy3D(&c));

  OK(cuMemFreeHost(pinned));
  OK(cuMemFree(dp));
  OK(cuArrayDestroy(a));
  OK(cuArrayDestroy(layered));
}

float texel(size_t x, size_t y) { return static_cast<float>(x) + 100.0f * static_cast<float>(y); }

// What ivc_tex2d_read gives: texel (x + dx, y + dy), clamped or border.
float sample(int w, int h, int x, int y, CUaddress_mode mode, float border) {
  if (mode == CU_TR_ADDRESS_MODE_BORDER && (x < 0 || x >= w || y < 0 || y >= h)) return border;
  return texel(static_cast<size_t>(std::clamp(x, 0, w - 1)), static_cast<size_t>(std::clamp(y, 0, h - 1)));
}

bool run_tex(CUfunction f, CUtexObject t, int w, int h, int dx, int dy, CUaddress_mode mode, float border) {
  CUdeviceptr out = 0;
  OK(cuMemAlloc(&out, sizeof(float) * w * h));
  unsigned long long tv = t;
  void* params[] = {&tv, &out, &w, &h, &dx, &dy};
  OK(cuLaunchKernel(f, (w + 15) / 16, (h + 15) / 16, 1, 16, 16, 1, 0, nullptr, params, nullptr));
  OK(cuCtxSynchronize());
  std::vector<float> got(static_cast<size_t>(w) * h);
  OK(cuMemcpyDtoH(got.data(), out, got.size() * sizeof(float)));
  OK(cuMemFree(out));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      if (got[static_cast<size_t>(y) * w + x] != sample(w, h, x + dx, y + dy, mode, border)) return false;
  return true;
}

void textures(CUmodule m) {
  CUfunction read = nullptr, write = nullptr;
  OK(cuModuleGetFunction(&read, m, "ivc_tex2d_read"));
  OK(cuModuleGetFunction(&write, m, "ivc_surf2d_write"));
  const int W = 48, H = 20;
  CUarray a = make_array(W, H, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST);
  std::vector<float> img(static_cast<size_t>(W) * H);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) img[static_cast<size_t>(y) * W + x] = texel(x, y);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = img.data();
  c.srcPitch = W * sizeof(float);
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = W * sizeof(float);
  c.Height = H;
  OK(cuMemcpy2D(&c));

  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_ARRAY;
  res.res.array.hArray = a;
  CUDA_TEXTURE_DESC td{};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  CUtexObject clamp = 0, border = 0;
  OK(cuTexObjectCreate(&clamp, &res, &td, nullptr));
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_BORDER;
  td.borderColor[0] = -1.0f;
  OK(cuTexObjectCreate(&border, &res, &td, nullptr));
  EXPECT(clamp != 0 && border != 0 && clamp != border);
  EXPECT(run_tex(read, clamp, W, H, -3, 2, CU_TR_ADDRESS_MODE_CLAMP, 0));
  EXPECT(run_tex(read, clamp, W, H, 5, -4, CU_TR_ADDRESS_MODE_CLAMP, 0));
  EXPECT(run_tex(read, border, W, H, 2, 3, CU_TR_ADDRESS_MODE_BORDER, -1.0f));
  std::printf("arrays: tex2D over an array: clamp and border sampled as the CPU model\n");

  CUDA_RESOURCE_DESC rq{};
  OK(cuTexObjectGetResourceDesc(&rq, clamp));
  EXPECT(rq.resType == CU_RESOURCE_TYPE_ARRAY && rq.res.array.hArray == a);
  CUDA_TEXTURE_DESC tq{};
  OK(cuTexObjectGetTextureDesc(&tq, border));
  EXPECT(tq.addressMode[0] == CU_TR_ADDRESS_MODE_BORDER && tq.filterMode == CU_TR_FILTER_MODE_POINT);
  std::printf("arrays: texture desc border color %.1f\n", static_cast<double>(tq.borderColor[0]));
  CUDA_RESOURCE_VIEW_DESC vq{};
  const CUresult vr = cuTexObjectGetResourceViewDesc(&vq, clamp);
  std::printf("arrays: view desc of a texture made without one -> %s\n", check::name(vr));

  // A texture over pitched device memory.
  CUdeviceptr dp = 0;
  size_t pitch = 0;
  OK(cuMemAllocPitch(&dp, &pitch, W * sizeof(float), H, 4));
  CUDA_MEMCPY2D c2{};
  c2.srcMemoryType = CU_MEMORYTYPE_HOST;
  c2.srcHost = img.data();
  c2.srcPitch = W * sizeof(float);
  c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.dstDevice = dp;
  c2.dstPitch = pitch;
  c2.WidthInBytes = W * sizeof(float);
  c2.Height = H;
  OK(cuMemcpy2D(&c2));
  CUDA_RESOURCE_DESC pres{};
  pres.resType = CU_RESOURCE_TYPE_PITCH2D;
  pres.res.pitch2D.devPtr = dp;
  pres.res.pitch2D.format = CU_AD_FORMAT_FLOAT;
  pres.res.pitch2D.numChannels = 1;
  pres.res.pitch2D.width = W;
  pres.res.pitch2D.height = H;
  pres.res.pitch2D.pitchInBytes = pitch;
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
  CUtexObject ptex = 0;
  OK(cuTexObjectCreate(&ptex, &pres, &td, nullptr));
  EXPECT(run_tex(read, ptex, W, H, -1, -1, CU_TR_ADDRESS_MODE_CLAMP, 0));
  CUDA_RESOURCE_DESC pq{};
  OK(cuTexObjectGetResourceDesc(&pq, ptex));
  EXPECT(pq.resType == CU_RESOURCE_TYPE_PITCH2D && pq.res.pitch2D.devPtr == dp && pq.res.pitch2D.width == W);
  std::printf("arrays: tex2D over pitched memory sampled as the CPU model\n");

  // A surface: the kernel writes, a copy reads back.
  CUsurfObject surf = 0;
  OK(cuSurfObjectCreate(&surf, &res));
  float base = 0.25f;
  int w = W, h = H;
  unsigned long long sv = surf;
  void* params[] = {&sv, &w, &h, &base};
  OK(cuLaunchKernel(write, (W + 15) / 16, (H + 15) / 16, 1, 16, 16, 1, 0, nullptr, params, nullptr));
  OK(cuCtxSynchronize());
  std::vector<float> got(img.size());
  c = CUDA_MEMCPY2D{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = got.data();
  c.dstPitch = W * sizeof(float);
  c.WidthInBytes = W * sizeof(float);
  c.Height = H;
  OK(cuMemcpy2D(&c));
  bool ok = true;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      ok = ok && got[static_cast<size_t>(y) * W + x] == base + static_cast<float>(x) + 1000.0f * static_cast<float>(y);
  EXPECT(ok);
  CUDA_RESOURCE_DESC sq{};
  OK(cuSurfObjectGetResourceDesc(&sq, surf));
  EXPECT(sq.resType == CU_RESOURCE_TYPE_ARRAY && sq.res.array.hArray == a);
  std::printf("arrays: surf2Dwrite wrote what the CPU model says\n");

  // Invalid: unknown objects, a surface over an array without SURFACE_LDST,
  // a texture object destroyed twice.
  // Destroying an unknown object succeeds on driver 580 (a no-op).
  OK(cuTexObjectDestroy(0x7654321));
  CUDA_RESOURCE_DESC junk{};
  uncertain("cuTexObjectGetResourceDesc of an unknown object", cuTexObjectGetResourceDesc(&junk, 0x7654321));
  OK(cuSurfObjectDestroy(0x7654321));
  CUarray plain = make_array(8, 8, 0, CU_AD_FORMAT_FLOAT, 1, 0);
  CUDA_RESOURCE_DESC pr{};
  pr.resType = CU_RESOURCE_TYPE_ARRAY;
  pr.res.array.hArray = plain;
  CUsurfObject bad = 0;
  // Driver 580 accepts it (the object is unusable for surface writes).
  OK(cuSurfObjectCreate(&bad, &pr));
  OK(cuSurfObjectDestroy(bad));

  OK(cuSurfObjectDestroy(surf));
  OK(cuTexObjectDestroy(clamp));
  OK(cuTexObjectDestroy(border));
  OK(cuTexObjectDestroy(ptex));
  OK(cuMemFree(dp));
  OK(cuArrayDestroy(a));
  OK(cuArrayDestroy(plain));
}

void mipmaps() {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 64;
  d.Height = 32;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUmipmappedArray m = nullptr;
  OK(cuMipmappedArrayCreate(&m, &d, 4));
  CUarray l2 = nullptr, l2again = nullptr;
  OK(cuMipmappedArrayGetLevel(&l2, m, 2));
  OK(cuMipmappedArrayGetLevel(&l2again, m, 2));
  std::printf("arrays: a level asked for twice is the same array: %s\n", l2 == l2again ? "yes" : "no");
  print_desc("mipmap level 2", l2);
  const auto data = check::random_bytes(16 * 8 * 4, 41);
  std::vector<unsigned char> back(data.size());
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = data.data();
  c.srcPitch = 64;
  c.srcHeight = 8;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = l2;
  c.WidthInBytes = 64;
  c.Height = 8;
  c.Depth = 1;
  OK(cuMemcpy3D(&c));
  std::swap(c.srcMemoryType, c.dstMemoryType);
  c.srcArray = l2;
  c.dstArray = nullptr;
  c.srcHost = nullptr;
  c.dstHost = back.data();
  c.dstPitch = 64;
  c.dstHeight = 8;
  OK(cuMemcpy3D(&c));
  EXPECT(back == data);
  CUarray l9 = nullptr;
  uncertain("cuMipmappedArrayGetLevel past the last level", cuMipmappedArrayGetLevel(&l9, m, 9));
  // A texture over the whole mipmapped array.
  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  res.res.mipmap.hMipmappedArray = m;
  CUDA_TEXTURE_DESC td{};
  td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  td.mipmapFilterMode = CU_TR_FILTER_MODE_POINT;
  td.maxMipmapLevelClamp = 3.0f;
  td.flags = CU_TRSF_NORMALIZED_COORDINATES;
  CUtexObject t = 0;
  OK(cuTexObjectCreate(&t, &res, &td, nullptr));
  CUDA_RESOURCE_DESC rq{};
  OK(cuTexObjectGetResourceDesc(&rq, t));
  EXPECT(rq.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY && rq.res.mipmap.hMipmappedArray == m);
  OK(cuTexObjectDestroy(t));
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  std::printf("arrays: cuMipmappedArrayGetMemoryRequirements -> %s\n",
              check::name(cuMipmappedArrayGetMemoryRequirements(&req, m, 0)));
  OK(cuMipmappedArrayDestroy(m));
  std::printf("arrays: mipmapped array: level descriptor, copies, texture\n");
}

void invalid(bool destroyed) {
  CUDA_ARRAY_DESCRIPTOR d{};
  d.Width = 0;
  d.Height = 4;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a = nullptr;
  uncertain("cuArrayCreate with width 0", cuArrayCreate(&a, &d));
  d.Width = 8;
  d.NumChannels = 3;
  uncertain("cuArrayCreate with 3 channels", cuArrayCreate(&a, &d));
  d.NumChannels = 1;
  OK(cuArrayCreate(&a, &d));
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  std::printf("arrays: cuArrayGetMemoryRequirements of a plain array -> %s\n",
              check::name(cuArrayGetMemoryRequirements(&req, a, 0)));
  OK(cuArrayDestroy(a));
  if (!destroyed) return;
  // A destroyed handle is a dangling pointer to the driver, which may crash
  // on it (as on forged stream handles, drv_errors): opt-in natively.
  float x[4] = {};
  uncertain("HtoA into a destroyed array", cuMemcpyHtoA(a, 0, x, sizeof x));
  uncertain("cuArrayDestroy twice", cuArrayDestroy(a));
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  bool destroyed = false;
  for (int i = 1; i < argc; ++i) destroyed |= std::strcmp(argv[i], "--destroyed-handles") == 0;
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_arrays --ptx FILE [--destroyed-handles]\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  CUmodule m = nullptr;
  OK(cuModuleLoad(&m, ptx));
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  if (check::g_failures != 0) return check::finish("drv_arrays");
  one_d(s);
  two_d(s);
  three_d(s);
  textures(m);
  mipmaps();
  invalid(destroyed);
  OK(cuStreamDestroy(s));
  OK(cuModuleUnload(m));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_arrays");
}
