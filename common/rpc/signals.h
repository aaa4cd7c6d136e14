// Clean shutdown for daemons: block SIGINT and SIGTERM in every thread (call first thing in
// main), then wait for one of them on the main thread.
#ifndef LAMINA_COMMON_RPC_SIGNALS_H_
#define LAMINA_COMMON_RPC_SIGNALS_H_

namespace lamina {

// Blocks SIGINT and SIGTERM; threads created afterwards inherit the mask.
void BlockTerminationSignals();
// Waits for SIGINT or SIGTERM and returns its number.
int WaitForTerminationSignal();

}  // namespace lamina

#endif  // LAMINA_COMMON_RPC_SIGNALS_H_
