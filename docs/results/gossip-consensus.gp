set terminal pngcairo size 900,560 noenhanced
set output 'gossip-consensus.png'
set title 'E6, part 1: gossip averaging without training'
set xlabel 'gossip round'
set ylabel 'consensus distance / initial'
set logscale y
set grid
set key bottom left
plot 'gossip-consensus.dat' index 0 with linespoints title '1peer', 'gossip-consensus.dat' index 1 with lines dashtype 2 title '1peer: (1-gap)^t', 'gossip-consensus.dat' index 2 with linespoints title '2peer', 'gossip-consensus.dat' index 3 with lines dashtype 2 title '2peer: (1-gap)^t', 'gossip-consensus.dat' index 4 with linespoints title 'ring', 'gossip-consensus.dat' index 5 with lines dashtype 2 title 'ring: (1-gap)^t', 'gossip-consensus.dat' index 6 with linespoints title '1peer-outer', 'gossip-consensus.dat' index 7 with linespoints title '2peer-outer'
