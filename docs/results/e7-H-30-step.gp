set terminal pngcairo size 900,560 noenhanced
set output 'e7-H-30-step.png'
set title 'E7: GASLoC forms at H = 1 and H = 30 [H=30]'
set xlabel 'training step (inner steps)'
set ylabel 'validation loss (nats per token, average model)'
set grid
set key top right
plot 'e7-H-30-step.dat' index 0 with linespoints title 'anchor', 'e7-H-30-step.dat' index 1 with linespoints title 'mix_after', 'e7-H-30-step.dat' index 2 with linespoints title 'accelerated', 5.9302412078695514 with lines dashtype 2 linecolor 'gray40' title 'unigram baseline (5.930)'
