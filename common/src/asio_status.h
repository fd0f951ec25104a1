// Internal to zps::wire: the one conversion of an Asio (Boost.System) error to a Status, shared by
// rpc_client.cc and rpc_server.cc.
#pragma once

#include <boost/asio/error.hpp>
#include <boost/system/error_code.hpp>
#include <string>
#include <string_view>

#include "zps/common/status.h"

namespace zps::rpc::internal {

/// "what: <Asio's message>", with a code by kind: a peer or network that went away, refused or
/// timed out, and a name that does not resolve, are Unavailable (retry may help); an aborted
/// operation is Cancelled; a malformed argument (e.g. an address) is InvalidArgument; anything
/// else (a port in use, no permission) is IoError.
inline Status FromAsio(std::string_view what, const boost::system::error_code& ec) {
  namespace error = boost::asio::error;
  std::string text = std::string(what) + ": " + ec.message();
  if (ec == error::eof || ec == error::connection_reset || ec == error::connection_refused ||
      ec == error::connection_aborted || ec == error::broken_pipe ||
      ec == error::host_unreachable || ec == error::network_unreachable ||
      ec == error::network_down || ec == error::network_reset || ec == error::timed_out ||
      ec == error::not_connected || ec == error::shut_down ||
      ec.category() == error::get_netdb_category() ||
      ec.category() == error::get_addrinfo_category()) {
    return Unavailable(std::move(text));
  }
  if (ec == error::operation_aborted) return Cancelled(std::move(text));
  if (ec == error::invalid_argument || ec == boost::system::errc::invalid_argument) {
    return InvalidArgument(std::move(text));
  }
  return IoError(std::move(text));
}

}  // namespace zps::rpc::internal
