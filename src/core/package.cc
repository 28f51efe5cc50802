// libmend.so's own translation unit: the package's version, for a consumer
// to check what it loaded. Everything else comes from mend's static
// libraries, linked into the shared object whole.
namespace mend {

extern const char kPackageVersion[];
const char kPackageVersion[] = MEND_VERSION;

}  // namespace mend
