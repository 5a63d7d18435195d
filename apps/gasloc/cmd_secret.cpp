// `gasloc secret --out FILE`: a new job secret (32 random bytes from OpenSSL's CSPRNG, as 64 hex
// characters) in a file of mode 0600, never over an existing one. Every host of the job gets a
// copy; ranks read it through cluster.secret_file, launchers and stores through --secret-file
// (docs/communication.md, "Authenticated jobs").
#include <fmt/format.h>

#include "commands.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::app {

Action add_secret(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  app.add_option("--out", *out, "the file to write (mode 0600; an existing file is never overwritten)")->required();
  return [out]() {
    write_secret_file(*out);
    fmt::print("gasloc secret: wrote a new job secret to {} (mode 0600); copy it to every host of the job (e.g. scp -p) "
               "and give it as cluster.secret_file, gasloc launch --secret-file or gasloc store --secret-file\n",
               *out);
    return 0;
  };
}

}  // namespace gasloc::app
